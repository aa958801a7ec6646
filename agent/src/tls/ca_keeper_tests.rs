use std::collections::BTreeMap;

use gpu_raft_store::ca::{CaCert, CaSet, NextCa};

use super::*;

fn view(voters: &[u64], members: &[u64], leader: Option<u64>) -> RaftView {
    RaftView {
        node_id: 2,
        leader,
        voters: voters.iter().copied().collect(),
        members: members.iter().map(|id| (*id, format!("h:{id}"))).collect(),
        ..RaftView::default()
    }
}

fn id(c: char) -> String {
    c.to_string().repeat(64)
}

fn held(signing: Option<char>, next: Option<char>, trusted: &[char]) -> Held {
    Held {
        signing: signing.map(id),
        next: next.map(id),
        trusted: trusted.iter().map(|c| id(*c)).collect(),
    }
}

/// A rotation whose trusted CAs are `trusted`, signing with `signing`, introducing `next`.
fn rotation(trusted: &[char], signing: char, next: Option<char>) -> CaSet {
    CaSet {
        trusted: trusted
            .iter()
            .map(|c| {
                let cert = CaCert {
                    key_id: id(*c),
                    cert_pem: format!(
                        "-----BEGIN CERTIFICATE-----\n{c}\n-----END CERTIFICATE-----\n"
                    ),
                };
                (id(*c), cert)
            })
            .collect::<BTreeMap<_, _>>(),
        signing: id(signing),
        next: next.map(|c| NextCa {
            key_id: id(c),
            sealed_key: "ab".into(),
        }),
        ..CaSet::default()
    }
}

#[test]
fn voters_hold_the_key_and_learners_let_it_go() {
    let voter = view(&[1, 2, 3], &[1, 2, 3], Some(1));
    let demoted = view(&[1, 3, 4], &[1, 2, 3, 4], Some(1));
    let cases = [
        (&voter, held(None, None, &['a']), vec![Step::Fetch]),
        (&voter, held(Some('a'), None, &['a']), vec![]),
        (
            &demoted,
            held(Some('a'), None, &['a']),
            vec![Step::DropKeys],
        ),
        (&demoted, held(None, None, &['a']), vec![]),
    ];
    for (v, h, want) in cases {
        assert_eq!(steps(v, &h, None), want, "{v:?} {h:?}");
    }
    // Membership not known yet (no leader, or not listed): keep what we have.
    for v in [
        view(&[], &[], None),
        view(&[1, 3, 4], &[1, 2, 3, 4], None),
        view(&[1, 3, 4], &[1, 3, 4], Some(1)),
    ] {
        assert_eq!(steps(&v, &held(Some('a'), None, &['a']), None), vec![]);
    }
}

#[test]
fn a_rotation_is_followed_step_by_step() {
    let voter = view(&[1, 2, 3], &[1, 2, 3], Some(1));
    let learner = view(&[1, 3, 4], &[1, 2, 3, 4], Some(1));
    let introduced = rotation(&['a', 'b'], 'a', Some('b'));
    let both = introduced.bundle_pem();

    // Introduced: trust both, then open the sealed key (a learner only trusts).
    assert_eq!(
        steps(&voter, &held(Some('a'), None, &['a']), Some(&introduced)),
        vec![Step::Trust(both.clone()), Step::OpenNext]
    );
    assert_eq!(
        steps(
            &voter,
            &held(Some('a'), Some('b'), &['a', 'b']),
            Some(&introduced)
        ),
        vec![]
    );
    assert_eq!(
        steps(&learner, &held(None, None, &['a']), Some(&introduced)),
        vec![Step::Trust(both)]
    );

    // Switched: the next key signs; a voter that never opened it fetches the new one.
    let switched = rotation(&['a', 'b'], 'b', None);
    assert_eq!(
        steps(
            &voter,
            &held(Some('a'), Some('b'), &['a', 'b']),
            Some(&switched)
        ),
        vec![Step::Promote]
    );
    assert_eq!(
        steps(&voter, &held(Some('a'), None, &['a', 'b']), Some(&switched)),
        vec![Step::Fetch]
    );
    assert_eq!(
        steps(&voter, &held(Some('b'), None, &['a', 'b']), Some(&switched)),
        vec![]
    );

    // Retired: trust only the new CA.
    let retired = rotation(&['b'], 'b', None);
    assert_eq!(
        steps(&voter, &held(Some('b'), None, &['a', 'b']), Some(&retired)),
        vec![Step::Trust(retired.bundle_pem())]
    );

    // Called off: the introduced key is forgotten.
    let called_off = rotation(&['a'], 'a', None);
    assert_eq!(
        steps(
            &voter,
            &held(Some('a'), Some('b'), &['a']),
            Some(&called_off)
        ),
        vec![Step::DropNext]
    );
}
