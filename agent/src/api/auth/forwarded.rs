//! The leader's own check of a write another agent forwarded to it (`RaftPeer.Propose`): the
//! forwarding agent's word about who asked counts for nothing.
//! - A write made for an API caller carries the caller's credential. The leader authenticates
//!   it against its own replica of the tokens, makes that token the write's actor, and checks
//!   the rights the command needs, as the forwarding agent's API did.
//! - A write with no caller is an agent's own. A voter's is taken as it comes: voters are the
//!   cluster's root of trust (any of them may become leader and write the log itself). Any
//!   other member may propose only its own reports (`ClusterState::is_own_report`): a
//!   compromised learner or edge host cannot mint a token, bind a job, or speak for a peer.

use gpu_raft_store::{ClusterState, Command, NodeId, Role, tenant};

use super::rbac::{Action, Identity};
use super::token;
use crate::raft::Proposal;

/// Who forwarded the write: the node its certificate names, whether it is a voter now, and
/// whether its build forwards callers' credentials (`protocol::CREDENTIALS_FORWARDED`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Forwarder {
    pub node: NodeId,
    pub voter: bool,
    pub sends_credentials: bool,
}

/// Check `proposal` from `from` against `state` at `now_ms`, and make its actor the caller
/// the leader authenticated. `Err` is why it is refused.
pub(crate) fn vouch(
    state: &ClusterState,
    from: Forwarder,
    proposal: &mut Proposal,
    now_ms: u64,
) -> Result<(), String> {
    let Some(meta) = proposal.meta.as_mut() else {
        return if from.voter || state.is_own_report(from.node, &proposal.cmd) {
            Ok(())
        } else {
            Err(format!(
                "node {} may propose only its own reports without a caller, not {}",
                from.node, proposal.cmd
            ))
        };
    };
    let Some(credential) = &proposal.credential else {
        // A write for a caller needs the caller's own credential, except from a voter of a
        // build from before credentials were forwarded (a rolling upgrade: voters are trusted
        // as they are), and a voter's record of a node's renewal, whose caller is that node.
        return if from.voter && (!from.sends_credentials || is_renewal(&proposal.cmd, meta)) {
            Ok(())
        } else {
            Err(format!(
                "a write for a caller must carry the caller's credential ({} from node {})",
                proposal.cmd, from.node
            ))
        };
    };
    let (id, secret) = credential
        .0
        .split_once('.')
        .ok_or("a malformed credential")?;
    let identity = token::identify(state.tokens.get(id), secret, now_ms)?;
    meta.actor.clone_from(&identity.token_id);
    for action in rights_needed(state, &proposal.cmd)? {
        identity.may(action)?;
    }
    let priority = match &proposal.cmd {
        Command::SubmitJob { spec, .. } => Some((spec.priority, spec.tenant.as_str())),
        Command::UpdateJob { job, update, .. } => update
            .priority
            .zip(state.jobs.get(job).map(|j| j.spec.tenant.as_str())),
        _ => None,
    };
    if let Some((priority, of)) = priority {
        tenant::check_priority(priority, state.tenants.get(of), identity.role)?;
    }
    if let Command::RecordCertificate {
        cert,
        enrolled_with,
    } = &proposal.cmd
    {
        enrols_only_nodes(&identity, &cert.subject)?;
        // An enrolment is counted against the token it came with, and only that one.
        if cert.subject.starts_with("node ") && enrolled_with.as_ref() != Some(&identity.token_id) {
            return Err(format!(
                "an enrolment must be recorded against its own join token {}",
                identity.token_id
            ));
        }
    }
    Ok(())
}

/// Whether `cmd` records a node's renewed certificate on the node's own behalf (`meta`).
fn is_renewal(cmd: &Command, meta: &gpu_raft_store::RequestMeta) -> bool {
    matches!(
        cmd,
        Command::RecordCertificate { cert, enrolled_with: None }
            if cert.subject.starts_with("node ") && meta.actor == cert.subject
    )
}

/// The rights a client's request for `cmd` needs, as the API's handlers check them (a
/// command no client request makes is refused).
fn rights_needed<'a>(state: &'a ClusterState, cmd: &'a Command) -> Result<Vec<Action<'a>>, String> {
    let accounts = |mapped: bool| {
        if mapped {
            Some(Action::MapAccounts)
        } else {
            None
        }
    };
    let rights = match cmd {
        Command::SubmitJob { spec, .. } => vec![Action::WriteJob(&spec.tenant)],
        Command::CancelJob { job }
        | Command::HoldJob { job, .. }
        | Command::CancelArray { array: job }
        | Command::HoldArray { array: job, .. }
        | Command::UpdateJob { job, .. }
        | Command::RequeueJob { job, .. } => {
            let tenant = state.jobs.get(job).map_or("", |j| j.spec.tenant.as_str());
            vec![Action::WriteJob(tenant)]
        }
        Command::SetNodeLabels { .. }
        | Command::CordonNode { .. }
        | Command::DrainNode { .. }
        | Command::SetGpuPartition { .. }
        | Command::RevokeCertificate { .. } => vec![Action::ManageNodes],
        Command::CreateToken { token } => std::iter::once(Action::ManageTokens)
            .chain(accounts(token.account.is_some()))
            .collect(),
        Command::RevokeToken { .. } => vec![Action::ManageTokens],
        Command::SetTokenAccount { .. } => vec![Action::MapAccounts],
        Command::CreateTenant { tenant } | Command::UpdateTenant { tenant } => {
            std::iter::once(Action::ManageTenants)
                .chain(accounts(tenant.account.is_some()))
                .collect()
        }
        Command::SetSchedulerPolicy { .. } => vec![Action::ManageScheduler],
        Command::SetRegistryCredential { .. } => vec![Action::ManageTenants],
        Command::IntroduceCa { .. } | Command::SwitchCa { .. } | Command::RetireCa { .. } => {
            vec![Action::RotateCa]
        }
        Command::SetAlertRule { .. } | Command::DeleteAlertRule { .. } => {
            vec![Action::ManageAlerts]
        }
        // Enrolment (a node token) or a client certificate for one's own token: which one,
        // `enrols_only_nodes` checks from the certificate's subject.
        Command::RecordCertificate { .. } | Command::AuditDenied { .. } => vec![],
        // The record of an action the API took itself (fault injection), checked there.
        Command::RecordAction { .. } => vec![Action::ManageNodes],
        other => return Err(format!("{other} is not a request a client makes")),
    };
    Ok(rights)
}

/// Node, operator and admin tokens enrol agents; any token gets a client certificate.
fn enrols_only_nodes(identity: &Identity, subject: &str) -> Result<(), String> {
    let node = subject.starts_with("node ");
    match (identity.role, node) {
        (Role::Node | Role::Operator | Role::Admin, true) | (_, false) => Ok(()),
        (role, true) => Err(format!("a {role} token may not enrol an agent")),
    }
}

#[cfg(test)]
mod tests {
    use gpu_raft_store::{LogEntry, RequestMeta, TokenRecord};

    use super::*;
    use crate::api::auth::token::digest;
    use crate::raft::Credential;

    fn state_with(tokens: &[(&str, Role, &str)]) -> ClusterState {
        let mut s = ClusterState::new();
        for (id, role, secret) in tokens {
            let token = TokenRecord {
                id: (*id).into(),
                secret_sha256: digest(secret),
                role: *role,
                tenant: (*role == Role::User).then(|| "default".to_owned()),
                description: String::new(),
                created_at_ms: 1,
                created_by: "system:test".into(),
                revoked: false,
                account: None,
                limits: Default::default(),
            };
            s.apply(&LogEntry {
                proposed_at_ms: 1,
                cmd: Command::CreateToken { token },
                meta: None,
                request: None,
            });
        }
        s
    }

    fn proposal(cmd: Command, actor: Option<&str>, credential: Option<&str>) -> Proposal {
        Proposal {
            cmd,
            meta: actor.map(|a| RequestMeta {
                actor: a.into(),
                verb: "v".into(),
                object: "o".into(),
                request_id: "r".into(),
                source: "s".into(),
            }),
            credential: credential.map(|c| Credential(c.into())),
        }
    }

    const LEARNER: Forwarder = Forwarder {
        node: 2,
        voter: false,
        sends_credentials: true,
    };

    #[test]
    fn a_voter_records_a_nodes_renewal_in_that_nodes_name_only() {
        let s = ClusterState::new();
        let renewal = |subject: &str| Command::RecordCertificate {
            cert: gpu_raft_store::CertRecord {
                serial: "0a".into(),
                subject: subject.into(),
                not_after_ms: 10,
                issued_at_ms: 1,
                revoked: false,
                revoked_reason: String::new(),
                issuer: String::new(),
            },
            enrolled_with: None,
        };
        let voter = Forwarder {
            voter: true,
            ..LEARNER
        };
        let mut p = proposal(renewal("node 3"), Some("node 3"), None);
        assert_eq!(vouch(&s, voter, &mut p, 1), Ok(()));
        for (from, subject, actor) in [
            (LEARNER, "node 3", "node 3"),
            (voter, "node 3", "node 4"),
            (voter, "client admin", "client admin"),
        ] {
            let mut p = proposal(renewal(subject), Some(actor), None);
            assert!(
                vouch(&s, from, &mut p, 1).is_err(),
                "{from:?} {subject} as {actor}"
            );
        }
    }

    #[test]
    fn the_leader_makes_the_credentials_token_the_actor_and_checks_its_rights() {
        let s = state_with(&[("adm", Role::Admin, "a1"), ("usr", Role::User, "u1")]);
        let revoke = || Command::RevokeToken { id: "usr".into() };
        // The forwarder's word for the actor is replaced by the credential's token.
        let mut p = proposal(revoke(), Some("someone"), Some("adm.a1"));
        assert_eq!(vouch(&s, LEARNER, &mut p, 1), Ok(()));
        assert_eq!(p.meta.map(|m| m.actor).as_deref(), Some("adm"));
        // A credential without the right, a wrong secret, none at all.
        let mut p = proposal(revoke(), Some("adm"), Some("usr.u1"));
        let e = vouch(&s, LEARNER, &mut p, 1).expect_err("a user token");
        assert!(e.contains("may not manage tokens"), "{e}");
        let mut p = proposal(revoke(), Some("adm"), Some("adm.wrong"));
        assert!(vouch(&s, LEARNER, &mut p, 1).is_err());
        let mut p = proposal(revoke(), Some("adm"), None);
        assert!(vouch(&s, LEARNER, &mut p, 1).is_err());
        // A refusal on record comes with its caller's credential too; a command no client
        // makes is refused.
        let denied = || Command::AuditDenied {
            reason: "not yours".into(),
        };
        let mut p = proposal(denied(), Some("anonymous"), None);
        assert!(vouch(&s, LEARNER, &mut p, 1).is_err());
        let mut p = proposal(denied(), Some("x"), Some("usr.u1"));
        assert_eq!(vouch(&s, LEARNER, &mut p, 1), Ok(()));
        let bind = Command::BindJobs { binds: vec![] };
        let e = vouch(
            &s,
            LEARNER,
            &mut proposal(bind.clone(), Some("adm"), Some("adm.a1")),
            1,
        )
        .expect_err("not a client's");
        assert!(e.contains("not a request a client makes"), "{e}");
        // Without a caller: a voter's duty, not a learner's.
        let voter = Forwarder {
            node: 1,
            voter: true,
            sends_credentials: true,
        };
        assert_eq!(
            vouch(&s, voter, &mut proposal(bind.clone(), None, None), 1),
            Ok(())
        );
        assert!(vouch(&s, LEARNER, &mut proposal(bind, None, None), 1).is_err());
    }
}
