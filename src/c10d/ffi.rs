//! The `extern "C"` surface of `shim.cpp`, one declaration per function there. Only
//! [`super::ProcessGroup`] calls these; see the shim for the contract (0 = ok, else a message in
//! `err` to be freed with `lr_dist_free_string`).

use std::ffi::{c_char, c_int, c_void};

extern "C" {
    pub fn lr_dist_free_string(s: *mut c_char);
    pub fn lr_dist_init(
        backend: c_int,
        host: *const c_char,
        port: c_int,
        rank: c_int,
        world_size: c_int,
        timeout_ms: i64,
        gloo_iface: *const c_char,
        gloo_host: *const c_char,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    pub fn lr_dist_free(group: *mut c_void);
    pub fn lr_dist_all_reduce(
        g: *mut c_void,
        t: *mut c_void,
        op: c_int,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> c_int;
    pub fn lr_dist_broadcast(
        g: *mut c_void,
        t: *mut c_void,
        root: c_int,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> c_int;
    pub fn lr_dist_all_gather(
        g: *mut c_void,
        out: *mut c_void,
        input: *mut c_void,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> c_int;
    pub fn lr_dist_reduce_scatter(
        g: *mut c_void,
        out: *mut c_void,
        input: *mut c_void,
        op: c_int,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> c_int;
    pub fn lr_dist_all_to_all(
        g: *mut c_void,
        out: *mut c_void,
        input: *mut c_void,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> c_int;
    pub fn lr_dist_barrier(g: *mut c_void, timeout_ms: i64, err: *mut *mut c_char) -> c_int;
    pub fn lr_dist_subgroup(
        parent: *mut c_void,
        tag: *const c_char,
        index: c_int,
        n: c_int,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    pub fn lr_dist_all_to_all_v(
        g: *mut c_void,
        out: *mut c_void,
        input: *mut c_void,
        out_splits: *const i64,
        in_splits: *const i64,
        n: i64,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> c_int;
    pub fn lr_dist_all_to_all_autograd(
        g: *mut c_void,
        input: *mut c_void,
        out_splits: *const i64,
        in_splits: *const i64,
        n: i64,
        timeout_ms: i64,
        err: *mut *mut c_char,
    ) -> *mut c_void;
    pub fn lr_dist_poisoned(g: *mut c_void) -> *mut c_char;
}
