//! The log's flusher: one thread that makes written log entries durable in the background and
//! reports them in order, so `append` returns as soon as its entries are readable (openraft
//! replicates them meanwhile) and the appends waiting at the same moment share one fsync.
//!
//! Every request is answered after a flush that began after the request was queued, so it
//! covers every write made before it; requests are answered in the order they were queued.

use std::io;
use std::sync::Arc;
use std::sync::mpsc;

use openraft::storage::LogFlushed;
use tokio::sync::oneshot;

use crate::TypeConfig;
use crate::failpoint;
use crate::storage::engine::KvEngine;
use crate::write_trace::{self, Stage};

enum Request {
    /// Report the entries of one `append` durable: the first and last of their indexes.
    Append(LogFlushed<TypeConfig>, Option<(u64, u64)>),
    /// Answer once everything written so far is durable and every earlier append reported.
    Barrier(oneshot::Sender<io::Result<()>>),
}

/// The handle on a store's flusher thread; it ends when the last handle is dropped.
#[derive(Clone)]
pub(crate) struct Flusher {
    requests: mpsc::Sender<Request>,
}

impl Flusher {
    pub(crate) fn start(engine: Arc<dyn KvEngine>) -> io::Result<Self> {
        let (requests, queue) = mpsc::channel();
        std::thread::Builder::new()
            .name("log-flush".into())
            .spawn(move || run(&*engine, &queue))?;
        Ok(Self { requests })
    }

    /// Report `callback` once the entries written before this call are durable; `indexes`:
    /// the first and last index of the entries it reports.
    pub(crate) fn append(&self, callback: LogFlushed<TypeConfig>, indexes: Option<(u64, u64)>) {
        if let Err(mpsc::SendError(Request::Append(callback, _))) =
            self.requests.send(Request::Append(callback, indexes))
        {
            callback.log_io_completed(Err(stopped()));
        }
    }

    /// Wait until everything written so far is durable and every earlier append reported.
    pub(crate) async fn barrier(&self) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Barrier(tx))
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }
}

fn run(engine: &dyn KvEngine, queue: &mpsc::Receiver<Request>) {
    while let Ok(first) = queue.recv() {
        let waiting: Vec<Request> = std::iter::once(first).chain(queue.try_iter()).collect();
        let appends = waiting.iter().any(|r| matches!(r, Request::Append(..)));
        if appends {
            failpoint::crash("log-append-before-fsync");
        }
        let flushed = engine.flush();
        if appends && flushed.is_ok() {
            failpoint::crash("log-append-after-fsync");
        }
        for request in waiting {
            let result = match &flushed {
                Ok(()) => Ok(()),
                Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
            };
            match request {
                Request::Append(callback, indexes) => {
                    if let (Ok(()), Some((first, last))) = (&result, indexes) {
                        write_trace::stamp_each(Stage::Flushed, first..=last);
                    }
                    callback.log_io_completed(result);
                }
                Request::Barrier(tx) => {
                    let _ = tx.send(result);
                }
            }
        }
    }
}

fn stopped() -> io::Error {
    io::Error::other("the log flusher has stopped")
}
