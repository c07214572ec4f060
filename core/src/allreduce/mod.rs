//! Ring all-reduce. (Being built.)
