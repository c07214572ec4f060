//! DiLoCo outer state. (Being built.)
