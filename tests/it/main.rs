//! Integration tests: one binary, one module per area.

mod cli;
mod common;
mod io;
mod model;
mod train;
