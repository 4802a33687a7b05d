//! Integration tests: one binary, one module per area.

mod adversarial;
mod align;
mod chat;
mod cli;
mod common;
mod dist;
mod dist_train;
mod docs;
mod engine;
mod filter_tasks;
mod harnesses;
mod io;
mod learn_scripts;
mod model;
mod pipeline;
mod prefix_cache;
mod proxy;
mod proxy_sdk;
mod report;
mod rollout;
mod runtime;
mod sandbox;
mod slurm;
mod synth;
mod train;
mod validate;
