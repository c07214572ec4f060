//! # loco-reports
//!
//! Metrics files to CSV summaries, plots and report.html. (Being built: issue 5.)
