//! Every integration test, in one binary: one link of the test support and the
//! library instead of one per file (a fresh clone's test build went from 41 test
//! binaries to one). Each file is a module named after the behaviour it tests; the
//! support (`support/`) is compiled once.

mod admin;
mod admin_keys;
mod answers;
mod browser;
mod chaos;
mod chaos_scale;
mod cli;
mod compose;
mod concurrency;
mod cors;
#[cfg(feature = "failpoints")]
mod crash;
mod demo;
mod docker_build;
mod encryption;
mod failover;
mod faults;
#[cfg(feature = "failpoints")]
mod file_crash;
mod file_store;
mod fingerprint;
mod fingerprint_rules;
mod guarding;
mod handler;
mod https_upstream;
mod key_command;
mod key_format;
mod key_resolve;
mod key_sources;
mod keys_list;
mod kubernetes;
mod layout;
mod lease;
mod limits;
mod monitoring;
mod one_view;
mod operations;
mod postgres_failover;
mod postgres_store;
mod postgres_support;
mod postgres_table;
mod postgres_tls;
mod principal;
mod proxy_redis;
mod readme;
mod real_upstreams;
mod reconcile;
mod redis_fencing;
mod redis_full;
mod redis_malformed;
mod redis_store;
mod redis_support;
mod reload;
mod replay;
mod replay_authorization;
mod replication;
mod resolve;
mod retry_after;
mod scope_quota;
mod seams;
mod sentinel;
mod store_contract;
mod streaming;
mod support;
mod traces;
mod upgrade;
mod uploads;
mod upstream_outcomes;
mod workers;
