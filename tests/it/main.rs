//! Integration tests: one binary, one module per area.

mod chat;
mod cli;
mod common;
mod docs;
mod filter_tasks;
mod io;
mod model;
mod proxy;
mod report;
mod rollout;
mod runtime;
mod sandbox;
mod synth;
mod train;
mod validate;
