//! The metrics schema both backends write. (Being built.)
