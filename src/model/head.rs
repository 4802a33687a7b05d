//! The LM head over selected positions: next-token log-probs (plus an entropy diagnostic) and
//! their backward, optionally in chunks of positions so that at most `chunk × vocab` logits
//! exist at a time.
//!
//! Why chunks: on a 151936-wide vocabulary the `[positions, vocab]` fp32 logits of a micro-batch
//! (and the log-softmax autograd keeps beside them) are the largest tensors of a training step,
//! far larger than a tiny or mid-size model's activations. Chunking the forward alone does not
//! help training: autograd would keep every chunk's logits until the backward. So
//! [`CausalLm::backward_logprobs`] builds no graph through the head. For each chunk, without
//! autograd, it computes the logits of the chunk's (detached) hidden states, their log-softmax
//! (the log-probs) and softmax `p`, and the gradients of Σ_t c_t·log p_t in closed form: with
//! `G = c·(onehot(next) − p)` (what log_softmax + gather backpropagate into the logits), the
//! hidden-state gradient `G·W` and the head weight's `Gᵀ·x`, each rearranged so that only `p`
//! is `[chunk, vocab]`. The weight gradient goes straight into the weight's `.grad` (the
//! embedding's, when tied); the chunk is freed. One backward of the decoder with the collected
//! hidden-state gradient follows. The arithmetic is that of the unchunked autograd path up to
//! summation order (tests/it/train.rs compares per-parameter gradients), and it is cheaper:
//! no log-softmax backward and no `[N, vocab]` gradient tensors.

use tch::{Kind, Tensor};

use super::layers::linear;
use super::sampled::{self, Processing};
use super::CausalLm;

/// Most positions per call whose entropy [`CausalLm::next_token_logprobs`] computes (×2).
pub const ENTROPY_SAMPLE: i64 = 256;

/// Default positions per chunk of [`CausalLm::backward_logprobs`] (train-step
/// `--logprob-chunk`): 256 × 151936 fp32 logits are 0.16 GB, and a 256-row head matmul already
/// runs at full speed; on CPU, scripts/bench/train_memory.sh measured 256 both leaner and faster
/// than 1024 (2×3072 tokens on the tiny MoE: max RSS 0.28× vs 0.70× of the unchunked head,
/// time 0.90× vs 1.03×).
pub const DEFAULT_LOGPROB_CHUNK: usize = 256;

/// Rows `r` of `start..start + len` with `r % stride == 0`, as `(first local row, stride)`;
/// `None` when there is none.
fn strided_rows(start: i64, len: i64, stride: i64) -> Option<i64> {
    let first = (start + stride - 1) / stride * stride - start;
    (first < len).then_some(first)
}

impl CausalLm {
    /// Projects `[N, hidden]` hidden states to `[N, vocab]` logits (in the model dtype).
    pub fn logits(&self, hidden: &Tensor) -> Tensor {
        linear(hidden, self.head_weight())
    }

    /// Log-prob of each next token: `out[t] = log_softmax(logits[t])[tokens[t+1]]` for the
    /// selected positions `at` (`[N]` int64) whose next tokens are `next` (`[N]`), in fp32.
    /// With `with_entropy`, also the entropy of an evenly strided subset of those distributions
    /// (all of them up to [`ENTROPY_SAMPLE`] positions): a full-vocabulary entropy costs more
    /// than the log-probs themselves, and the mean over a strided subset estimates the same
    /// diagnostic.
    pub fn next_token_logprobs(
        &self,
        hidden: &Tensor,
        at: &Tensor,
        next: &Tensor,
        with_entropy: bool,
    ) -> (Tensor, Option<Tensor>) {
        self.next_token_logprobs_chunked(hidden, at, next, with_entropy, None, None)
    }

    /// [`Self::next_token_logprobs`] computing the logits of at most `chunk` positions at a time
    /// (`None`: all at once), under the distributions the tokens were sampled from (`proc`, see
    /// [`super::sampled`]; `None`: the model's own). Same values; without gradients
    /// (`no_grad_guard`) the peak memory is one chunk's logits. Under autograd every chunk's
    /// graph is kept, so training uses [`Self::backward_logprobs`] instead. The entropy is that
    /// of the same distributions.
    pub fn next_token_logprobs_chunked(
        &self,
        hidden: &Tensor,
        at: &Tensor,
        next: &Tensor,
        with_entropy: bool,
        chunk: Option<usize>,
        proc: Option<&Processing>,
    ) -> (Tensor, Option<Tensor>) {
        let n = at.size()[0];
        let stride = (n / ENTROPY_SAMPLE).max(1);
        let chunk = chunk.map_or(n, |c| c.max(1) as i64).max(1);
        let (mut lps, mut ents) = (Vec::new(), Vec::new());
        let mut start = 0;
        while start < n {
            let len = chunk.min(n - start);
            let logits = self.logits(&hidden.index_select(0, &at.narrow(0, start, len)));
            let nx = next.narrow(0, start, len);
            let rows = proc.map(|p| p.narrow(start, len));
            let lsm = sampled::log_softmax(&logits, &nx, rows.as_ref());
            lps.push(lsm.gather(1, &nx.unsqueeze(1), false).squeeze_dim(1));
            if let Some(first) = with_entropy.then(|| strided_rows(start, len, stride)).flatten() {
                let sub = lsm.slice(0, first, len, stride);
                // Row-wise Σ p·log p as a batched dot product: no [N, vocab] product tensor.
                ents.push(-sub.exp().unsqueeze(1).bmm(&sub.unsqueeze(2)).view([-1]));
            }
            start += len;
        }
        let cat = |v: Vec<Tensor>| match v.len() {
            1 => v.into_iter().next().expect("invariant: one element"),
            _ => Tensor::cat(&v, 0),
        };
        let lp = if lps.is_empty() {
            Tensor::zeros([0], (Kind::Float, hidden.device()))
        } else {
            cat(lps)
        };
        let entropy = with_entropy.then(|| {
            if ents.is_empty() {
                Tensor::zeros([0], (Kind::Float, hidden.device()))
            } else {
                cat(ents)
            }
        });
        (lp, entropy)
    }

    /// Backpropagates `Σ_t coef[t] · log π(next[t] | hidden[at[t]])` from the head through
    /// `hidden`'s graph (the decoder), accumulating into the parameters' `.grad`; returns the
    /// log-probs (detached, fp32). `chunk: None` differentiates the unchunked
    /// [`Self::next_token_logprobs`] with autograd (all `[N, vocab]` logits and log-softmax
    /// alive until the backward); `Some(c)` runs the graph-free chunked head described in the
    /// module header (at most `c × vocab` logits alive), then one backward of the decoder.
    pub fn backward_logprobs(
        &self,
        hidden: &Tensor,
        at: &Tensor,
        next: &Tensor,
        coef: &Tensor,
        chunk: Option<usize>,
        proc: Option<&Processing>,
    ) -> Result<Tensor, tch::TchError> {
        let Some(chunk) = chunk.map(|c| c.max(1) as i64) else {
            let (lp, _) = self.next_token_logprobs_chunked(hidden, at, next, false, None, proc);
            (&lp * coef).sum(Kind::Float).f_backward()?;
            return Ok(lp.detach());
        };
        let n = at.size()[0];
        let w = self.head_weight();
        let h = hidden.detach();
        let mut grad_h = h.zeros_like();
        // The head weight's gradient accumulates in place into its `.grad` when that exists
        // (every micro-batch after the process's first backward); otherwise into a buffer that
        // one surrogate term hands to autograd at the end.
        let (mut grad_w, buffered) = match (w.requires_grad(), w.grad()) {
            (false, _) => (None, false),
            (true, g) if g.defined() => (Some(g), false),
            (true, _) => (Some(w.zeros_like()), true),
        };
        let mut lps = Vec::new();
        let mut start = 0;
        let _g = tch::no_grad_guard();
        while start < n {
            let len = chunk.min(n - start);
            let rows = at.narrow(0, start, len);
            let nx = next.narrow(0, start, len);
            let x = h.index_select(0, &rows);
            let sub = proc.map(|p| p.narrow(start, len));
            let mut lsm = sampled::log_softmax(&linear(&x, w), &nx, sub.as_ref());
            lps.push(lsm.gather(1, &nx.unsqueeze(1), false).squeeze_dim(1));
            let p = lsm.exp_().to_kind(x.kind());
            // G = c·(onehot(next) − p) is d(Σ c·log p[next])/d logits; with logits = x·Wᵀ,
            // dx = G·W = c·(W[next] − p·W) and dW = Gᵀ·x = scatter(c·x at next) − pᵀ·(c·x):
            // no [chunk, vocab] tensor beyond `p`. Under a sampled distribution (tempered by T,
            // renormalised over a support) `p` is that distribution and G is divided by T.
            let c = match &sub {
                Some(sub) => coef.narrow(0, start, len) / &sub.temperature,
                None => coef.narrow(0, start, len),
            };
            let c = c.to_kind(x.kind()).unsqueeze(1);
            let dx = (w.index_select(0, &nx) - p.matmul(w)) * &c;
            let _ = grad_h.index_add_(0, &rows, &dx);
            if let Some(gw) = grad_w.as_mut() {
                let cx = x * &c;
                let _ = gw.index_add_(0, &nx, &cx);
                let _ = gw.addmm_(&p.tr(), &(-cx));
            }
            start += len;
        }
        drop(_g);
        let mut surrogate = hidden.requires_grad().then(|| (hidden * grad_h).sum(Kind::Float));
        if let (true, Some(gw)) = (buffered, grad_w) {
            let term = (w * gw).sum(Kind::Float);
            surrogate = Some(match surrogate {
                Some(s) => s + term,
                None => term,
            });
        }
        if let Some(s) = surrogate {
            // Fallible: under expert parallelism the backward runs collectives (a dead peer
            // is an error of this call, not a panic).
            s.f_backward()?;
        }
        Ok(if lps.is_empty() {
            Tensor::zeros([0], (Kind::Float, hidden.device()))
        } else {
            Tensor::cat(&lps, 0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::strided_rows;

    #[test]
    fn strided_rows_continue_the_global_stride_across_chunks() {
        // Global rows 0, 3, 6, 9 of 0..10 in chunks 0..4, 4..8, 8..10.
        assert_eq!(strided_rows(0, 4, 3), Some(0));
        assert_eq!(strided_rows(4, 4, 3), Some(2)); // global 6
        assert_eq!(strided_rows(8, 2, 3), Some(1)); // global 9
        assert_eq!(strided_rows(7, 1, 3), None); // row 7 only
        assert_eq!(strided_rows(5, 3, 1), Some(0));
    }
}
