//! The scenario/config file both backends read. (Being built.)
