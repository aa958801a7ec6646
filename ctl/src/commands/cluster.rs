//! `gpuctl cluster status|members|snapshot save|transfer-leader`.
//!
//! JSON (stable): `status` prints the object below; `members` prints the `members` array.
//! `{"node_id", "leader_id" (null when none), "leader_addr", "term", "commit_index",
//!   "applied_index", "last_log_index", "voter_target", "members": [{"node_id", "addr",
//!   "role" ("voter"|"learner"), "is_leader", "reachable" (null on a stale view),
//!   "last_contact_ms_ago", "matched_index", "build" (version+commit, `0.1.0+3439984`; null
//!   when unknown: a stale view's other members, or a build older than the field), "protocol"
//!   (the internal protocol version its agent registered with; null when unknown)}]}`
//! `snapshot save` prints `{"file", "index", "cluster_id", "bytes"}`; `transfer-leader`
//! `{"from", "leader"}`.

use gpu_proto::v1 as pb;
use gpu_proto::v1::cluster_service_client::ClusterServiceClient;
use serde_json::{Value, json};

use super::{Answer, Ctx, Failure};
use crate::cli::{ClusterVerb, SnapshotVerb};
use crate::output::table_of;

pub(crate) async fn run(ctx: &Ctx, verb: ClusterVerb) -> Result<Answer, Failure> {
    let (stale, members_only) = match verb {
        ClusterVerb::Status { stale } => (stale, false),
        ClusterVerb::Members { stale } => (stale, true),
        ClusterVerb::Snapshot(SnapshotVerb::Save { file }) => return save(ctx, &file).await,
        ClusterVerb::TransferLeader { to, from } => return transfer(ctx, to, from).await,
    };
    let req = pb::GetStatusRequest { stale };
    let status = ctx
        .call(ClusterServiceClient::new, req, async |mut c, r| {
            c.get_status(r).await
        })
        .await?;
    let answer = match members_only {
        false => ctx.answer(|| status_json(&status), || status_table(&status)),
        true => ctx.answer_list(&status.members, member_json, members_table),
    };
    Ok(Answer {
        positive: status.leader_id.is_some(),
        ..answer
    })
}

/// `transfer-leader`: who led, and who leads now.
async fn transfer(ctx: &Ctx, to: Option<u64>, from: Option<u64>) -> Result<Answer, Failure> {
    let req = pb::TransferLeadershipRequest { to, from };
    let moved = ctx
        .call(ClusterServiceClient::new, req, async |mut c, r| {
            c.transfer_leadership(r).await
        })
        .await?;
    Ok(ctx.answer(
        || json!({"from": moved.from, "leader": moved.leader}),
        || match moved.from == moved.leader {
            true => format!("n{} leads; nothing to move\n", moved.leader),
            false => format!(
                "leadership moved from n{} to n{}\n",
                moved.from, moved.leader
            ),
        },
    ))
}

fn role(m: &pb::Member) -> &'static str {
    match pb::MemberRole::try_from(m.role) {
        Ok(pb::MemberRole::Voter) => "voter",
        Ok(pb::MemberRole::Learner) => "learner",
        _ => "unknown",
    }
}

fn member_json(m: &pb::Member) -> Value {
    json!({
        "node_id": m.node_id,
        "addr": m.addr,
        "role": role(m),
        "is_leader": m.is_leader,
        "reachable": m.reachable,
        "last_contact_ms_ago": m.last_contact_ms_ago,
        "matched_index": m.matched_index,
        "build": m.build,
        "protocol": m.protocol,
    })
}

fn status_json(s: &pb::ClusterStatus) -> Value {
    json!({
        "node_id": s.node_id,
        "leader_id": s.leader_id,
        "leader_addr": s.leader_addr,
        "term": s.term,
        "commit_index": s.commit_index,
        "applied_index": s.applied_index,
        "last_log_index": s.last_log_index,
        "voter_target": s.voter_target,
        "members": s.members.iter().map(member_json).collect::<Vec<_>>(),
    })
}

fn status_table(s: &pb::ClusterStatus) -> String {
    let leader = s.leader_id.map_or_else(
        || "none".to_owned(),
        |l| format!("n{l} ({})", s.leader_addr),
    );
    let voters = s.members.iter().filter(|m| role(m) == "voter").count();
    let mut out = format!(
        "Leader:   {leader}\nTerm:     {}\nLog:      commit {} / applied {} / last {}\nMembers:  {} ({voters} voters, target {})\nAnswered: n{}\n\n",
        s.term,
        s.commit_index,
        s.applied_index,
        s.last_log_index,
        s.members.len(),
        s.voter_target,
        s.node_id,
    );
    out.push_str(&members_table(&s.members));
    out
}

fn members_table(members: &[pb::Member]) -> String {
    table_of(
        &[
            "NODE",
            "ADDRESS",
            "ROLE",
            "REACHABLE",
            "LAST CONTACT",
            "MATCHED",
            "BUILD",
            "PROTOCOL",
        ],
        members,
        |m| {
            vec![
                format!("n{}", m.node_id),
                m.addr.clone(),
                format!("{}{}", role(m), if m.is_leader { " (leader)" } else { "" }),
                match m.reachable {
                    Some(true) => "yes".into(),
                    Some(false) => "no".into(),
                    None => "?".into(),
                },
                m.last_contact_ms_ago
                    .map_or_else(|| "-".into(), |ms| format!("{ms}ms")),
                m.matched_index
                    .map_or_else(|| "-".into(), |i| i.to_string()),
                m.build.clone().unwrap_or_else(|| "?".into()),
                m.protocol.map_or_else(|| "?".into(), |p| p.to_string()),
            ]
        },
    )
}

/// `snapshot save FILE`: the backup from any agent, written to a temporary file beside FILE,
/// fsynced and renamed over it (mode 0600), so FILE is either the old one or the whole new one.
async fn save(ctx: &Ctx, file: &std::path::Path) -> Result<Answer, Failure> {
    let backup = ctx
        .endpoints
        .call(|ch| async move {
            let mut pieces = ClusterServiceClient::new(ch)
                .max_decoding_message_size(gpu_proto::MAX_MESSAGE_BYTES)
                .stream_snapshot(pb::SaveSnapshotRequest {})
                .await?
                .into_inner();
            let mut whole = pb::ClusterBackup::default();
            while let Some(piece) = pieces.message().await? {
                whole.index = piece.index;
                whole.cluster_id = piece.cluster_id;
                whole.data.extend_from_slice(&piece.data);
            }
            Ok(whole)
        })
        .await?;
    write_private(file, &backup.data)
        .map_err(|e| Failure::Usage(format!("writing {}: {e}", file.display())))?;
    Ok(ctx.answer(
        || {
            json!({
                "file": file.display().to_string(),
                "index": backup.index,
                "cluster_id": backup.cluster_id,
                "bytes": backup.data.len(),
            })
        },
        || {
            format!(
                "saved the cluster state at index {} ({} bytes, cluster {}) to {}\n",
                backup.index,
                backup.data.len(),
                backup.cluster_id,
                file.display()
            )
        },
    ))
}

fn write_private(file: &std::path::Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    };
    let name = file
        .file_name()
        .ok_or_else(|| std::io::Error::other("FILE must name a file"))?;
    // A backup folder that does not exist yet is made, for the admin only.
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(".{}.tmp", name.to_string_lossy()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, file)?;
    std::fs::File::open(dir)?.sync_all()
}
