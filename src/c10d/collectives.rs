//! The collectives of a [`ProcessGroup`]: each checks its tensors (on the group's device,
//! contiguous), runs under the group's
//! timeout and names the rank, the collective and what it moved when it fails. On a world of one
//! process each is the identity.

use std::ffi::{c_char, c_int, c_void};

use tch::Tensor;

use super::{device_name, ffi, take_err, DistError, ProcessGroup, ReduceOp};

impl ProcessGroup {
    fn check(&self, op: &'static str, what: &str, tensors: &[&Tensor]) -> Result<(), DistError> {
        self.check_device(op, what, tensors)?;
        for t in tensors {
            if !t.is_contiguous() {
                return Err(DistError::BadTensor {
                    rank: self.global.0,
                    op,
                    what: what.to_string(),
                    msg: "tensor is not contiguous".into(),
                });
            }
        }
        Ok(())
    }

    /// Every tensor is on the group's device (NCCL would reject a host tensor only on a GPU
    /// cluster; Gloo on CPU would hide it).
    fn check_device(&self, op: &'static str, what: &str, tensors: &[&Tensor]) -> Result<(), DistError> {
        for t in tensors {
            if t.device() != self.device {
                return Err(DistError::BadTensor {
                    rank: self.global.0,
                    op,
                    what: what.to_string(),
                    msg: format!(
                        "tensor on {}, but the group's device is {}",
                        device_name(t.device()),
                        device_name(self.device)
                    ),
                });
            }
        }
        Ok(())
    }

    fn call(
        &self,
        op: &'static str,
        what: &str,
        f: impl FnOnce(*mut c_void, i64, *mut *mut c_char) -> c_int,
    ) -> Result<(), DistError> {
        let Some(g) = self.group else {
            return Ok(());
        };
        let mut err: *mut c_char = std::ptr::null_mut();
        if f(g.as_ptr(), self.timeout.as_millis() as i64, &mut err) == 0 {
            return Ok(());
        }
        Err(self.collective_error(op, what, take_err(err)))
    }

    fn collective_error(&self, op: &'static str, what: &str, msg: String) -> DistError {
        DistError::Collective {
            rank: self.global.0,
            world: self.global.1,
            op,
            what: match &self.label {
                Some(l) => format!("{what}; {l}"),
                None => what.to_string(),
            },
            timeout: self.timeout,
            msg,
        }
    }

    fn bad_splits(&self, op: &'static str, what: &str, msg: String) -> DistError {
        DistError::BadTensor {
            rank: self.global.0,
            op,
            what: what.to_string(),
            msg,
        }
    }

    /// Checks uneven splits: one entry per rank, summing to the rows of `input` / `out`.
    fn check_splits(
        &self,
        op: &'static str,
        what: &str,
        out_rows: Option<i64>,
        input: &Tensor,
        out_splits: &[i64],
        in_splits: &[i64],
    ) -> Result<(), DistError> {
        let n = self.world_size;
        if out_splits.len() != n || in_splits.len() != n {
            return Err(self.bad_splits(
                op,
                what,
                format!(
                    "{} output and {} input splits for a group of {n}",
                    out_splits.len(),
                    in_splits.len()
                ),
            ));
        }
        if out_splits.iter().chain(in_splits).any(|&s| s < 0) {
            return Err(self.bad_splits(op, what, "negative split".into()));
        }
        let rows = input.size().first().copied().unwrap_or(0);
        if in_splits.iter().sum::<i64>() != rows {
            return Err(self.bad_splits(
                op,
                what,
                format!("input splits {in_splits:?} do not sum to its {rows} rows"),
            ));
        }
        if let Some(o) = out_rows.filter(|&o| o != out_splits.iter().sum::<i64>()) {
            return Err(self.bad_splits(
                op,
                what,
                format!("output splits {out_splits:?} do not sum to its {o} rows"),
            ));
        }
        Ok(())
    }

    /// Uneven splits along dim 0: `in_splits[j]` rows of `input` go to rank j; `out` receives
    /// `out_splits[i]` rows from rank i, in rank order. Every rank must call it, even with
    /// nothing to send or receive.
    pub fn all_to_all_v(
        &self,
        out: &Tensor,
        input: &Tensor,
        out_splits: &[i64],
        in_splits: &[i64],
        what: &str,
    ) -> Result<(), DistError> {
        self.check("all_to_all", what, &[out, input])?;
        let out_rows = out.size().first().copied().unwrap_or(0);
        self.check_splits("all_to_all", what, Some(out_rows), input, out_splits, in_splits)?;
        if self.group.is_none() {
            tch::no_grad(|| out.shallow_clone().copy_(input));
            return Ok(());
        }
        self.call("all_to_all", what, |g, ms, err| unsafe {
            ffi::lr_dist_all_to_all_v(
                g,
                out.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                out_splits.as_ptr(),
                in_splits.as_ptr(),
                out_splits.len() as i64,
                ms,
                err,
            )
        })
    }

    /// [`Self::all_to_all_v`] as a new tensor with a gradient: its backward sends each gradient
    /// row back to the rank its row came from (the reverse exchange, itself a collective every
    /// rank's backward takes part in). A failure in the backward surfaces as the error of
    /// `f_backward`.
    pub fn all_to_all_autograd(
        &self,
        input: &Tensor,
        out_splits: &[i64],
        in_splits: &[i64],
        what: &str,
    ) -> Result<Tensor, DistError> {
        self.check_device("all_to_all", what, &[input])?;
        self.check_splits("all_to_all", what, None, input, out_splits, in_splits)?;
        let Some(g) = self.group else {
            return Ok(input.shallow_clone());
        };
        let mut err: *mut c_char = std::ptr::null_mut();
        // SAFETY: `input` and the splits outlive the call (which waits for the exchange); the
        // group outlives the graph's backward as long as `self` does (callers keep it alive).
        let p = unsafe {
            ffi::lr_dist_all_to_all_autograd(
                g.as_ptr(),
                input.as_ptr() as *mut c_void,
                out_splits.as_ptr(),
                in_splits.as_ptr(),
                out_splits.len() as i64,
                self.timeout.as_millis() as i64,
                &mut err,
            )
        };
        if p.is_null() {
            return Err(self.collective_error("all_to_all", what, take_err(err)));
        }
        // SAFETY: a `new at::Tensor` that tch now owns (and frees with `delete`).
        Ok(unsafe { Tensor::from_ptr(p as *mut _) })
    }

    /// Reduces `t` in place over all ranks. `what` says what it holds, for errors.
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp, what: &str) -> Result<(), DistError> {
        self.check("all_reduce", what, &[t])?;
        // SAFETY: `t` outlives the call, which waits for the work to finish.
        self.call("all_reduce", what, |g, ms, err| unsafe {
            ffi::lr_dist_all_reduce(g, t.as_ptr() as *mut c_void, op.code(), ms, err)
        })
    }

    /// Copies rank `root`'s `t` into every rank's `t`.
    pub fn broadcast(&self, t: &Tensor, root: usize, what: &str) -> Result<(), DistError> {
        self.check("broadcast", what, &[t])?;
        self.call("broadcast", what, |g, ms, err| unsafe {
            ffi::lr_dist_broadcast(g, t.as_ptr() as *mut c_void, root as c_int, ms, err)
        })
    }

    /// Fills `out` (world_size × numel(input) elements) with every rank's `input`, rank order.
    pub fn all_gather(&self, out: &Tensor, input: &Tensor, what: &str) -> Result<(), DistError> {
        self.check("all_gather", what, &[out, input])?;
        self.same_numel("all_gather", what, out, input)?;
        if self.group.is_none() {
            tch::no_grad(|| out.shallow_clone().view_as(input).copy_(input));
            return Ok(());
        }
        // c10d splits the output along dim 0: hand it flat views.
        let (out, input) = (out.view([-1]), input.view([-1]));
        self.call("all_gather", what, |g, ms, err| unsafe {
            ffi::lr_dist_all_gather(
                g,
                out.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                ms,
                err,
            )
        })
    }

    /// Reduces `input` (world_size blocks of numel(out)) over ranks; rank r keeps block r in `out`.
    pub fn reduce_scatter(
        &self,
        out: &Tensor,
        input: &Tensor,
        op: ReduceOp,
        what: &str,
    ) -> Result<(), DistError> {
        self.check("reduce_scatter", what, &[out, input])?;
        self.same_numel("reduce_scatter", what, input, out)?;
        if self.group.is_none() {
            tch::no_grad(|| out.shallow_clone().copy_(&input.view_as(out)));
            return Ok(());
        }
        let (out, input) = (out.view([-1]), input.view([-1]));
        self.call("reduce_scatter", what, |g, ms, err| unsafe {
            ffi::lr_dist_reduce_scatter(
                g,
                out.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                op.code(),
                ms,
                err,
            )
        })
    }

    /// Equal splits along dim 0: block j of `input` goes to rank j; block i of `out` comes from
    /// rank i.
    pub fn all_to_all(&self, out: &Tensor, input: &Tensor, what: &str) -> Result<(), DistError> {
        self.check("all_to_all", what, &[out, input])?;
        if out.size() != input.size()
            || input.size().first().copied().unwrap_or(0) % self.world_size as i64 != 0
        {
            return Err(DistError::BadTensor {
                rank: self.global.0,
                op: "all_to_all",
                what: what.to_string(),
                msg: format!(
                    "input {:?} and output {:?} must have one shape whose dim 0 divides by {}",
                    input.size(),
                    out.size(),
                    self.world_size
                ),
            });
        }
        if self.group.is_none() {
            tch::no_grad(|| out.shallow_clone().copy_(input));
            return Ok(());
        }
        self.call("all_to_all", what, |g, ms, err| unsafe {
            ffi::lr_dist_all_to_all(
                g,
                out.as_ptr() as *mut c_void,
                input.as_ptr() as *mut c_void,
                ms,
                err,
            )
        })
    }

    /// Waits until every rank got here.
    pub fn barrier(&self, what: &str) -> Result<(), DistError> {
        self.call("barrier", what, |g, ms, err| unsafe {
            ffi::lr_dist_barrier(g, ms, err)
        })
    }

    /// `big` must hold world_size × numel(small) elements.
    fn same_numel(
        &self,
        op: &'static str,
        what: &str,
        big: &Tensor,
        small: &Tensor,
    ) -> Result<(), DistError> {
        if big.numel() != small.numel() * self.world_size || big.kind() != small.kind() {
            return Err(DistError::BadTensor {
                rank: self.global.0,
                op,
                what: what.to_string(),
                msg: format!(
                    "{} {:?} elements vs {} {:?} × world size {}",
                    big.numel(),
                    big.kind(),
                    small.numel(),
                    small.kind(),
                    self.world_size
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tch::{Device, Kind};

    use super::*;

    #[test]
    fn a_collective_refuses_a_tensor_on_another_device() {
        // Regression: the trainer all-reduced host tensors (log-probs, scalars, flags) whatever
        // the model's device; NCCL rejects them, Gloo on CPU hid it.
        let pg = ProcessGroup::single().with_device(Device::Cuda(0));
        let t = Tensor::zeros([4], (Kind::Float, Device::Cpu));
        let want = |op: &str, what: &str| {
            format!("rank 0: {op} ({what}): tensor on cpu, but the group's device is cuda:0")
        };
        let e = pg.all_reduce(&t, ReduceOp::Sum, "π_old log-probs").unwrap_err();
        assert_eq!(e.to_string(), want("all_reduce", "π_old log-probs"));
        let e = pg.broadcast(&t, 0, "b").unwrap_err();
        assert_eq!(e.to_string(), want("broadcast", "b"));
        let e = pg.all_gather(&t, &t, "g").unwrap_err();
        assert_eq!(e.to_string(), want("all_gather", "g"));
        let e = pg.reduce_scatter(&t, &t, ReduceOp::Sum, "r").unwrap_err();
        assert_eq!(e.to_string(), want("reduce_scatter", "r"));
        let e = pg.all_to_all(&t, &t, "a").unwrap_err();
        assert_eq!(e.to_string(), want("all_to_all", "a"));
        let e = pg.all_to_all_v(&t, &t, &[4], &[4], "v").unwrap_err();
        assert_eq!(e.to_string(), want("all_to_all", "v"));
        let e = pg.all_to_all_autograd(&t, &[4], &[4], "d").unwrap_err();
        assert_eq!(e.to_string(), want("all_to_all", "d"));
        // On its own device the same call goes through (a world of one: the identity).
        let cpu = ProcessGroup::single();
        assert_eq!(cpu.device(), Device::Cpu);
        cpu.all_reduce(&t, ReduceOp::Sum, "π_old log-probs").unwrap();
        // Sub-groups inherit the device.
        let sub = pg.subgroup(&[0], "t", "sub").unwrap();
        assert_eq!(sub.device(), Device::Cuda(0));
    }
}
