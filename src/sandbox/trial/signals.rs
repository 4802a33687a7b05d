//! SIGINT/SIGTERM during a rollout: results gathered after the signal are the interruption's
//! doing, so they are never written; the run's sandboxes are swept and the process exits 130.

use std::time::Duration;

use crate::sandbox::Engine;

static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True once SIGINT/SIGTERM arrived: trial results from then on are the interruption's doing (the
/// sweep is removing their sandboxes) and must not be recorded as outcomes.
pub fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// Parks forever once [`interrupted`]: results gathered from then on are the interruption's
/// doing (the signal task is removing their sandboxes), so nothing may be written from them —
/// writing would mark them done. The signal task exits the process (130) after its sweep, and a
/// rerun runs that work again. Call before writing outcomes.
pub async fn park_if_interrupted() {
    if interrupted() {
        std::future::pending::<()>().await;
    }
}

/// On SIGINT/SIGTERM: flag [`interrupted`], remove every object of `run_id`, then exit 130. Call
/// once per process.
pub fn install_signal_sweep(engine: Engine, run_id: String) {
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut n = engine.sweep(Some(&run_id)).await.unwrap_or(0);
        // Creations the engine had already accepted when the signal came can land after the
        // first listing (seen with 4 trials in set-up at once): sweep again once they are in.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        n += engine.sweep(Some(&run_id)).await.unwrap_or(0);
        // Not eprintln!: with stderr gone it panics, the panic ends only this task, and the
        // process would hang interrupted instead of exiting.
        crate::stderr_line!("lego-rl: interrupted; removed {n} sandbox objects of run {run_id}");
        std::process::exit(130);
    });
}
