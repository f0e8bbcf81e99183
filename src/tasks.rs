//! The node's background tasks, in one supervised set.
//!
//! Every long-lived task (HTTP server, mesh event loop, ingest worker, watcher, eviction, probes, card
//! polling) is spawned here under a name. None of them is meant to end while the node runs, so the
//! first one that returns, fails or panics is reported by [`Tasks::failed`], naming it; the node then
//! stops with an error (a non-zero exit, so a process supervisor restarts it). Restarting a task in
//! place would hide the fault and could lose the state it owned (the swarm, queued messages).
//! Once [`Tasks::cancel`] is called, tasks ending is the expected shutdown and reported by nobody.

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::{Id, JoinSet};
use tokio_util::sync::CancellationToken;

/// Why the node stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("task `{task}` stopped unexpectedly")]
    Ended { task: &'static str },
    #[error("task `{task}` failed: {reason}")]
    Failed { task: &'static str, reason: String },
    #[error("task `{task}` panicked: {reason}")]
    Panicked { task: &'static str, reason: String },
}

impl TaskError {
    /// The name of the task that stopped.
    pub fn task(&self) -> &'static str {
        match self {
            TaskError::Ended { task } | TaskError::Failed { task, .. } | TaskError::Panicked { task, .. } => {
                task
            }
        }
    }
}

/// A set of named tasks sharing one cancellation token.
pub struct Tasks {
    set: JoinSet<Result<(), String>>,
    names: HashMap<Id, &'static str>,
    cancel: CancellationToken,
}

impl Tasks {
    pub fn new(cancel: CancellationToken) -> Self {
        Self { set: JoinSet::new(), names: HashMap::new(), cancel }
    }

    /// The token that tells every task to stop.
    pub fn token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Spawns a task that runs until the node stops; an `Err` it returns is reported as its failure.
    pub fn spawn<F, E>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let handle = self.set.spawn(async move { task.await.map_err(|e| e.to_string()) });
        self.names.insert(handle.id(), name);
    }

    /// Spawns a task that returns nothing: its returning at all is the failure.
    pub fn spawn_loop<F>(&mut self, name: &'static str, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn(name, async move {
            task.await;
            Ok::<(), std::convert::Infallible>(())
        });
    }

    /// Resolves when a task stops while the node is running (never for a healthy node, nor after
    /// [`Tasks::cancel`]).
    pub async fn failed(&mut self) -> TaskError {
        loop {
            let Some(joined) = self.set.join_next_with_id().await else {
                return std::future::pending().await;
            };
            if self.cancel.is_cancelled() {
                continue;
            }
            let error = match joined {
                Ok((id, Ok(()))) => TaskError::Ended { task: self.name(id) },
                Ok((id, Err(reason))) => TaskError::Failed { task: self.name(id), reason },
                Err(e) => {
                    let task = self.name(e.id());
                    if e.is_panic() {
                        TaskError::Panicked { task, reason: panic_message(e.into_panic()) }
                    } else {
                        TaskError::Ended { task }
                    }
                }
            };
            tracing::error!(task = error.task(), %error, "a node task stopped; the node stops");
            return error;
        }
    }

    fn name(&mut self, id: Id) -> &'static str {
        self.names.remove(&id).unwrap_or("unnamed")
    }

    /// Tells every task to stop.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Cancels, waits up to `grace` for the tasks to end, then aborts the rest.
    pub async fn shutdown(mut self, grace: Duration) {
        self.cancel.cancel();
        let drained = tokio::time::timeout(grace, async {
            while let Some(joined) = self.set.join_next_with_id().await {
                match joined {
                    Ok((id, Err(reason))) => {
                        tracing::warn!(task = self.name(id), %reason, "task failed while stopping")
                    }
                    Err(e) if e.is_panic() => {
                        tracing::warn!(task = self.name(e.id()), "task panicked while stopping")
                    }
                    _ => {}
                }
            }
        })
        .await;
        if drained.is_err() {
            let left: Vec<&str> = self.names.values().copied().collect();
            tracing::warn!(?left, "tasks still running after the grace period; aborting them");
        }
        self.set.shutdown().await;
    }

    /// Stops every task at once, as a crash would (tests).
    pub fn abort(mut self) {
        self.cancel.cancel();
        self.set.abort_all();
        self.set.detach_all();
    }
}

/// A periodic timer that ends with `cancel`, for the node's background loops:
/// `while ticks.next().await { ... }`. The first tick is at once; a late tick is delayed, not bunched.
pub struct Ticks {
    interval: tokio::time::Interval,
    cancel: CancellationToken,
}

impl Ticks {
    pub fn new(period: Duration, cancel: CancellationToken) -> Self {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { interval, cancel }
    }

    /// Waits for the next tick: `false` once the node is stopping.
    pub async fn next(&mut self) -> bool {
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = self.interval.tick() => true,
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => (*s).to_owned(),
            Err(_) => "a panic with no message".to_owned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(5);

    async fn first_failure(tasks: &mut Tasks) -> TaskError {
        tokio::time::timeout(PATIENCE, tasks.failed()).await.expect("a failure is reported")
    }

    #[tokio::test]
    async fn a_task_that_panics_fails_or_ends_is_named() {
        let mut tasks = Tasks::new(CancellationToken::new());
        let token = tasks.token();
        tasks.spawn_loop("healthy", async move { token.cancelled().await });
        tasks.spawn_loop("ingest", async { panic!("boom") });
        let e = first_failure(&mut tasks).await;
        assert!(matches!(&e, TaskError::Panicked { task: "ingest", reason } if reason == "boom"), "{e}");

        tasks.spawn("store", async { Err::<(), _>("disk on fire") });
        let e = first_failure(&mut tasks).await;
        assert_eq!(e.to_string(), "task `store` failed: disk on fire");

        tasks.spawn_loop("watcher", async {});
        assert_eq!(first_failure(&mut tasks).await.task(), "watcher");
        tasks.shutdown(PATIENCE).await;
    }

    #[tokio::test]
    async fn tasks_ending_after_cancel_are_the_shutdown_not_a_failure() {
        let mut tasks = Tasks::new(CancellationToken::new());
        for name in ["a", "b"] {
            let token = tasks.token();
            tasks.spawn_loop(name, async move { token.cancelled().await });
        }
        tasks.cancel();
        let failed = tokio::time::timeout(Duration::from_millis(200), tasks.failed()).await;
        assert!(failed.is_err(), "nothing reported");
        tasks.shutdown(PATIENCE).await;
    }

    #[tokio::test]
    async fn shutdown_aborts_what_does_not_stop_in_time() {
        let mut tasks = Tasks::new(CancellationToken::new());
        tasks.spawn_loop("stubborn", std::future::pending());
        let start = std::time::Instant::now();
        tasks.shutdown(Duration::from_millis(100)).await;
        assert!(start.elapsed() < PATIENCE);
    }
}
