//! Integration tests: one binary, one module per area.

mod cli;
mod common;
mod docs;
mod io;
mod report;
mod synth;
mod validate;
