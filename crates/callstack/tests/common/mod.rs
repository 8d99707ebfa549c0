//! Helpers of the machine-code unwinding tests.
pub mod chain;
pub mod cores;
