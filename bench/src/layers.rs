//! Where one write's time goes, layer by layer, beside etcd: one client at the leader, first
//! with a request that writes nothing (the client's transport and the member's request
//! handling), then a write on one member (adds the log append, its fsync and the apply), then
//! a write on three (adds replication to a follower); and under them the disk: an `fdatasync`
//! against sled's durable insert. etcd runs twice: as it starts by default
//! (plain HTTP) and with the mutual TLS gpumesh always runs.

use std::time::Duration;

use serde::Serialize;

use crate::etcd::{Etcd, Security};
use crate::fsync;
use crate::load::{self, LoadResult};
use crate::mesh::{self, Mesh};
use crate::stats::Summary;
use crate::target::{Crashable, Target};

/// One layer's runs.
#[derive(Debug, Serialize)]
pub struct Layer {
    pub name: &'static str,
    pub gpumesh: LoadResult,
    pub etcd_plain: Option<LoadResult>,
    pub etcd_tls: Option<LoadResult>,
}

/// The layers, and the disk under them.
#[derive(Debug, Serialize)]
pub struct Layers {
    pub layers: Vec<Layer>,
    /// A 4 KiB append and `fdatasync`: what etcd's log append comes down to.
    pub fdatasync: Summary,
    /// A log entry's size inserted into sled and flushed: what gpumesh's comes down to.
    pub sled_flush: Summary,
}

/// Rounds of each disk floor.
const DISK_ROUNDS: usize = 500;
/// About the bytes of a submission's log entry (577 in MessagePack, `gpu-bench codec`).
pub const ENTRY_BYTES: usize = 600;

/// Measure the disk floors and the three layers, each run lasting `run_for`.
pub async fn measure(run_for: Duration, skip_etcd: bool) -> anyhow::Result<Layers> {
    let scratch = tempfile::tempdir()?;
    let fdatasync = fsync::floor(scratch.path(), DISK_ROUNDS)?;
    let sled_flush = fsync::sled_floor(scratch.path(), DISK_ROUNDS, ENTRY_BYTES)?;
    let value_bytes = mesh::submission_bytes().saturating_sub(22);
    let mut layers = Vec::new();
    // Members, then each layer on them: (round trips instead of writes, its name).
    let steps: [(usize, &[(bool, &str)]); 2] = [
        (
            1,
            &[
                (true, "a request that writes nothing"),
                (false, "a write, 1 member"),
            ],
        ),
        (3, &[(false, "a write, 3 members")]),
    ];
    for (members, kinds) in steps {
        // One mesh at a time: the test harness allows no more.
        let mesh = Mesh::start(members as u64).await;
        let etcds = if skip_etcd {
            None
        } else {
            Some((
                Etcd::start(members, value_bytes, Security::Plain).await?,
                Etcd::start(members, value_bytes, Security::MutualTls).await?,
            ))
        };
        for &(round_trips, name) in kinds {
            let run = layers.len() as u64;
            let gpumesh = time(&mesh, round_trips, run_for, run).await?;
            let (etcd_plain, etcd_tls) = match &etcds {
                Some((plain, tls)) => (
                    Some(time(plain, round_trips, run_for, run).await?),
                    Some(time(tls, round_trips, run_for, run).await?),
                ),
                None => (None, None),
            };
            layers.push(Layer {
                name,
                gpumesh,
                etcd_plain,
                etcd_tls,
            });
        }
    }
    Ok(Layers {
        layers,
        fdatasync,
        sled_flush,
    })
}

/// One client at `target`'s leader for `run_for`: writes, or round trips.
async fn time<T: Crashable>(
    target: &T,
    round_trips: bool,
    run_for: Duration,
    run: u64,
) -> anyhow::Result<LoadResult> {
    let member = target.leader().await?;
    let through = AtLeader {
        target,
        member,
        round_trips,
    };
    load::closed_loop(&through, 1, run_for, run).await
}

/// A target seen from one member: every client connects there, and its writes are round trips
/// when asked.
struct AtLeader<'a, T> {
    target: &'a T,
    member: usize,
    round_trips: bool,
}

impl<T: Target> Target for AtLeader<'_, T> {
    type Client = T::Client;

    fn members(&self) -> usize {
        self.target.members()
    }

    fn pids(&self) -> Vec<u32> {
        self.target.pids()
    }

    async fn connect(&self, _client: usize) -> anyhow::Result<Self::Client> {
        self.target.connect(self.member).await
    }

    async fn write(&self, client: &mut Self::Client, seq: u64) -> anyhow::Result<()> {
        if self.round_trips {
            self.target.round_trip(client).await
        } else {
            self.target.write(client, seq).await
        }
    }

    async fn round_trip(&self, client: &mut Self::Client) -> anyhow::Result<()> {
        self.target.round_trip(client).await
    }
}
