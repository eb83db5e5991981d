//! Every task the daemon starts has an owner: a group that starts it, asks it to stop with one signal,
//! and waits for it, so shutdown ends only when every task it started has.

use std::{future::Future, sync::Arc, time::Duration};

use tokio::task::JoinHandle;
use tokio_util::{
    sync::{CancellationToken, WaitForCancellationFuture},
    task::TaskTracker,
};

/// A group of tasks: the ones it spawned, and the signal that asks them to stop.
///
/// A task counts until it ends (a finished task's memory is freed at once: the group keeps no handle).
/// A [`child`](Self::child) group is stopped by its own signal or by its parent's, and its tasks count in
/// the parent as well, so the daemon's root group waits for every task of every part.
#[derive(Debug, Clone)]
pub struct Tasks {
    /// This group's tracker first, then its parent's, and so on up to the root's.
    trackers: Arc<[TaskTracker]>,
    stop: CancellationToken,
}

impl Default for Tasks {
    fn default() -> Self {
        Self::new()
    }
}

impl Tasks {
    /// A root group: stopped only by [`stop`](Self::stop) or [`signal_stop`](Self::signal_stop).
    pub fn new() -> Self {
        Self { trackers: Arc::new([TaskTracker::new()]), stop: CancellationToken::new() }
    }

    /// A group inside this one: stopping this one stops it too, and this one waits for its tasks.
    pub fn child(&self) -> Self {
        let trackers = std::iter::once(TaskTracker::new()).chain(self.trackers.iter().cloned()).collect();
        Self { trackers, stop: self.stop.child_token() }
    }

    /// Starts `task` on the runtime, counted in this group (and its parents) until it ends.
    #[allow(clippy::disallowed_methods, reason = "the one place tasks are spawned; everything else spawns here")]
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        // Each token counts the task in one group until the task's future is dropped: when it ends, or
        // is aborted.
        let counted: Vec<_> = self.trackers.iter().map(TaskTracker::token).collect();
        tokio::spawn(async move {
            let _counted = counted;
            task.await
        })
    }

    fn tracker(&self) -> &TaskTracker {
        &self.trackers[0]
    }

    /// The stop signal, for a loop that selects on it or a stream cut short by it.
    pub fn signal(&self) -> &CancellationToken {
        &self.stop
    }

    /// Resolves once this group is asked to stop.
    pub fn stopping(&self) -> WaitForCancellationFuture<'_> {
        self.stop.cancelled()
    }

    /// Whether this group was asked to stop.
    pub fn is_stopping(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Asks this group's tasks to stop, without waiting.
    pub fn signal_stop(&self) {
        self.stop.cancel();
    }

    /// Asks this group's tasks to stop and waits up to `grace` for them to end; returns how many are
    /// still running then. Tasks spawned after this still count, but no wait ends later for them.
    pub async fn stop(&self, grace: Duration) -> usize {
        self.stop.cancel();
        self.wait(grace).await
    }

    /// Waits up to `grace` for this group's tasks to end, without asking them to; returns how many are
    /// still running then.
    pub async fn wait(&self, grace: Duration) -> usize {
        self.tracker().close();
        let _ = tokio::time::timeout(grace, self.tracker().wait()).await;
        self.tracker().len()
    }

    /// Tasks of this group still running.
    pub fn running(&self) -> usize {
        self.tracker().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stop_waits_for_every_task_of_the_group_and_its_children() {
        let tasks = Tasks::new();
        let child = tasks.child();
        let (stop, child_stop) = (tasks.signal().clone(), child.signal().clone());
        tasks.spawn(async move {
            stop.cancelled().await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        });
        child.spawn(async move {
            child_stop.cancelled().await;
            tokio::time::sleep(Duration::from_secs(2)).await;
        });
        assert_eq!((tasks.running(), child.running()), (2, 1), "a child's task counts in its parent too");
        assert_eq!(tasks.stop(Duration::from_secs(5)).await, 0, "both ended within the grace period");
        assert!(child.is_stopping(), "stopping a group stops its children");
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ignores_the_signal_is_counted_after_the_grace_period() {
        let tasks = Tasks::new();
        tasks.spawn(std::future::pending::<()>());
        tasks.spawn(async {});
        assert_eq!(tasks.stop(Duration::from_secs(1)).await, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_child_stops_alone_and_its_parent_goes_on() {
        let tasks = Tasks::new();
        let child = tasks.child();
        let signal = child.signal().clone();
        child.spawn(async move { signal.cancelled().await });
        assert_eq!(child.stop(Duration::from_secs(1)).await, 0);
        assert!(!tasks.is_stopping());
        assert_eq!(tasks.running(), 0, "the child's finished task left its parent's count too");
    }

    #[tokio::test]
    async fn a_finished_task_leaves_no_count_behind() {
        let tasks = Tasks::new();
        tasks.spawn(async {}).await.expect("task");
        assert_eq!(tasks.running(), 0);
    }
}
