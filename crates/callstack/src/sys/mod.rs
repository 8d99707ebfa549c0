//! Small wrappers over the operating system, each with its `unsafe` kept here.

pub mod maps;
