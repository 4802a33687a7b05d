//! Removal of everything a trial created: the `cleanup` stage on the normal path, and the
//! [`Drop`] backstop for early returns and panics.

use super::{now, Trial};
use crate::sandbox::SandboxError;

impl Trial {
    /// Removes everything the trial created (stage `cleanup`); safe to call more than once.
    pub async fn cleanup(&mut self) -> Result<(), SandboxError> {
        let start = now();
        let mut first_err = None;
        for id in [
            self.eval_container.take(),
            self.extract_container.take(),
            self.container.take(),
        ]
        .into_iter()
        .flatten()
        {
            if let Err(e) = self.engine.remove_container(&id).await {
                first_err.get_or_insert(e);
            }
        }
        if let Some(image) = self.snapshot_image.take() {
            if let Err(e) = self.engine.remove_image(&image).await {
                first_err.get_or_insert(e);
            }
        }
        if let Some(net) = self.network.take() {
            // (Engine::remove_network retries while the engine detaches the endpoints.)
            if let Err(e) = self.engine.remove_network(&net).await {
                first_err.get_or_insert(e);
            }
        }
        self.record("cleanup", start, if first_err.is_none() { "ok" } else { "error" });
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Trial {
    /// Backstop for early returns and panics: removal is spawned on the current runtime; the sweep by
    /// label removes whatever this could not.
    fn drop(&mut self) {
        let ids: Vec<String> = [
            self.eval_container.take(),
            self.extract_container.take(),
            self.container.take(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let net = self.network.take();
        let image = self.snapshot_image.take();
        if ids.is_empty() && net.is_none() && image.is_none() {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let engine = self.engine.clone();
            handle.spawn(async move {
                for id in ids {
                    let _ = engine.remove_container(&id).await;
                }
                if let Some(n) = net {
                    let _ = engine.remove_network(&n).await;
                }
                if let Some(i) = image {
                    let _ = engine.remove_image(&i).await;
                }
            });
        }
    }
}
