//! Integration tests: one binary, one module per area.

mod chat;
mod cli;
mod common;
mod docs;
mod filter_tasks;
mod io;
mod sandbox;
mod report;
mod synth;
mod validate;
mod model;
mod proxy;
mod train;
