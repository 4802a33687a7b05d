//! Integration tests: one binary, one module per area.

mod chat;
mod cli;
mod common;
mod docs;
mod io;
mod model;
mod proxy;
mod train;
