//! `Commit`: the future of one transaction's durability.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::oneshot;

use crate::error::StoreError;

/// Resolves when the transaction is durable (and already visible to reads).
#[must_use = "a Commit does nothing unless awaited or waited on"]
pub struct Commit {
    rx: oneshot::Receiver<Result<(), StoreError>>,
}

pub(crate) type CommitTx = oneshot::Sender<Result<(), StoreError>>;

impl Commit {
    pub(crate) fn pair() -> (CommitTx, Commit) {
        let (tx, rx) = oneshot::channel();
        (tx, Commit { rx })
    }

    /// A commit that is already resolved with `result`.
    pub(crate) fn ready(result: Result<(), StoreError>) -> Commit {
        let (tx, c) = Commit::pair();
        let _ = tx.send(result);
        c
    }

    /// Blocks until the transaction is durable. Do not call from inside an async task.
    pub fn wait(self) -> Result<(), StoreError> {
        match self.rx.blocking_recv() {
            Ok(r) => r,
            Err(_) => Err(StoreError::Closed),
        }
    }
}

impl Future for Commit {
    type Output = Result<(), StoreError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(r)) => Poll::Ready(r),
            Poll::Ready(Err(_)) => Poll::Ready(Err(StoreError::Closed)),
            Poll::Pending => Poll::Pending,
        }
    }
}
