//! lego-rl: harness-native reinforcement learning of coding agents.
//!
//! Data flows one way: tasks → images → trajectories → samples → checkpoint + metrics → report.
//! Each arrow is a zstd JSONL file of [`records`], read and written through [`io`]; each
//! subcommand in [`cmd`] is a thin layer over one library module.

pub mod align;
pub mod c10d;
pub mod chat;
pub mod cli;
pub mod cmd;
pub mod device;
pub mod engine;
pub mod env;
pub mod grade;
pub mod harness;
pub mod io;
pub mod model;
pub mod proxy;
pub mod records;
pub mod report;
pub mod rollout;
pub mod sandbox;
pub mod settings;
pub mod tasks;
pub mod text;
pub mod train;
pub mod ui;
pub mod units;
pub mod validate;
