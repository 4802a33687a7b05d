//! Integration tests: one binary, one module per area.

mod cli;
mod chat;
mod common;
mod io;
