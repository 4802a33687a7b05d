//! Integration tests: one binary, one module per area.

mod cli;
mod common;
mod filter_tasks;
mod io;
