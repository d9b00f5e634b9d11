//! Named scoped threads whose failures come back as errors naming the thread.

use std::thread::{self, Scope, ScopedJoinHandle};

use anyhow::{anyhow, Context, Result};

pub type Handle<'scope, T> = ScopedJoinHandle<'scope, Result<T>>;

/// Spawns a scoped thread named `name` (the name shows up as the thread's comm in traces).
pub fn spawn_named<'scope, 'env, T, F>(
    scope: &'scope Scope<'scope, 'env>,
    name: String,
    body: F,
) -> Result<Handle<'scope, T>>
where
    T: Send + 'scope,
    F: FnOnce() -> Result<T> + Send + 'scope,
{
    thread::Builder::new()
        .name(name.clone())
        .spawn_scoped(scope, body)
        .with_context(|| format!("spawning thread {name}"))
}

/// Joins a thread, turning a panic or an error into an error that names it.
pub fn join_named<T>(handle: Handle<'_, T>) -> Result<T> {
    let name = handle.thread().name().unwrap_or("unnamed").to_owned();
    handle
        .join()
        .map_err(|_| anyhow!("thread {name} panicked"))?
        .with_context(|| format!("thread {name}"))
}

#[cfg(test)]
mod tests {
    use anyhow::bail;

    use super::*;

    #[test]
    fn results_and_errors_come_back_with_the_thread_name() {
        thread::scope(|scope| {
            let fine = spawn_named(scope, "fine-0".to_owned(), || {
                let name = thread::current().name().map(str::to_owned);
                Ok(name)
            })
            .expect("spawn");
            let failing = spawn_named(scope, "failing-1".to_owned(), || -> Result<()> {
                bail!("boom")
            })
            .expect("spawn");
            assert_eq!(join_named(fine).expect("joins"), Some("fine-0".to_owned()));
            let message = format!("{:#}", join_named(failing).expect_err("fails"));
            assert_eq!(message, "thread failing-1: boom");
        });
    }
}
