//! The web console in a real headless Chromium, driven through WebDriver, against a real
//! two-agent mesh (the browser talks to the follower, n2): a user logs in with a token and sees
//! only their tenant's jobs; submits a job from the form and watches it change state without a
//! reload; cancels one; hostile job text renders inert; a page of another site can neither
//! cancel a job nor frame the console; the audit page is an admin's, not a user's; a revoked or
//! expired token ends the session. With 10,000 jobs in the state the jobs page's paint time is
//! measured and printed, and the pages are walked.
//!
//! Needs `chromium` and `chromedriver` (Debian); `GPUMESH_REQUIRE_BROWSER=1` (CI) makes their
//! absence a failure. `GPUMESH_CONSOLE_SHOTS=<dir>` saves a screenshot of every page there
//! (docs/console/ holds the committed ones).

use std::time::Duration;

use gpu_proto::v1 as pb;
use gpu_proto::v1::gpu_service_client::GpuServiceClient;
use gpu_proto::v1::job_service_client::JobServiceClient;
use gpu_proto::v1::token_service_client::TokenServiceClient;
use gpu_tests::webdriver::{self, Browser};
use gpu_tests::{Cluster, shell_job};

const WAIT: Duration = Duration::from_secs(30);

async fn token(c: &Cluster, role: pb::Role, tenant: &str, ttl_s: Option<u64>) -> String {
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    tokens
        .create_token(pb::CreateTokenRequest {
            role: role as i32,
            tenant: tenant.into(),
            description: format!("console test {tenant}"),
            ttl_s,
            ..Default::default()
        })
        .await
        .expect("a token")
        .into_inner()
        .bearer
}

async fn submit_as(c: &Cluster, bearer: &str, spec: pb::JobSpec, hold: bool) -> u64 {
    let mut jobs = JobServiceClient::new(c.channel_as(1, Some(bearer)).await.expect("channel"));
    jobs.submit_job(pb::SubmitJobRequest {
        spec: Some(spec),
        idempotency_key: String::new(),
        hold,
    })
    .await
    .expect("submitted")
    .into_inner()
    .job_id
}

/// Saves screenshots when `GPUMESH_CONSOLE_SHOTS` names a directory.
fn shot(b: &Browser, name: &str) {
    if let Some(dir) = std::env::var_os("GPUMESH_CONSOLE_SHOTS") {
        let path = std::path::Path::new(&dir).join(format!("{name}.png"));
        std::fs::write(&path, b.screenshot()).expect("write the screenshot");
    }
}

fn login(b: &Browser, base: &str, bearer: &str) {
    b.goto(&format!("{base}/console/login"));
    let field = b.must_find("#token");
    b.type_into(&field, bearer);
    b.click(&b.must_find("#login button"));
    b.wait_until("the jobs page after login", WAIT, |b| {
        b.url().ends_with("/console/jobs")
    });
}

fn logout(b: &Browser) {
    b.click(&b.must_find("header .who button"));
    b.wait_until("the login page", WAIT, |b| {
        b.url().contains("/console/login")
    });
}

/// The state the job page's live panel shows.
fn shown_state(b: &Browser) -> String {
    b.find("#job-state .state")
        .map(|e| b.text(&e))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_logs_in_sees_its_tenant_submits_watches_and_cancels() {
    if !webdriver::available() {
        return;
    }
    let c = Cluster::start(2, 1, "").await;
    let base = format!("https://{}", c.addr(2));
    let admin = c.admin_token();
    let vision = token(&c, pb::Role::User, "vision", None).await;
    let nlp = token(&c, pb::Role::User, "nlp", None).await;

    let secret = submit_as(&c, &nlp, shell_job("nlp-secret-run", 0, "sleep 600"), false).await;
    let hostile_script = "echo '<img src=x onerror=window.__xss=1>'; sleep 600";
    let mut hostile = shell_job("label-and-log", 0, hostile_script);
    hostile.labels = [(
        "note".to_owned(),
        "<script>window.__xss=2</script>".to_owned(),
    )]
    .into();
    let hostile = submit_as(&c, &vision, hostile, false).await;

    let b = Browser::start();
    // Not logged in: every page sends the browser to the login.
    b.goto(&format!("{base}/console/jobs"));
    assert!(b.url().contains("/console/login"), "{}", b.url());
    shot(&b, "login");

    // A user sees their tenant's jobs only, and no audit link.
    login(&b, &base, &vision);
    let page = b.source();
    assert!(page.contains("label-and-log"), "{page}");
    assert!(
        !page.contains("nlp-secret-run"),
        "another tenant's job shown:\n{page}"
    );
    assert!(b.find("nav a[href='/console/audit']").is_none(), "{page}");
    b.goto(&format!("{base}/console/jobs/{secret}"));
    assert!(b.source().contains("Forbidden"), "{}", b.source());
    b.goto(&format!("{base}/console/audit"));
    assert!(b.source().contains("Forbidden"), "{}", b.source());

    // Hostile text is shown as text: the command, the label and the log line.
    b.goto(&format!("{base}/console/jobs/{hostile}"));
    b.wait_until("the hostile log line", WAIT, |b| {
        b.text(&b.must_find("#log"))
            .contains("<img src=x onerror=window.__xss=1>")
    });
    let images = b.script("return document.querySelectorAll('img').length;", vec![]);
    let xss = b.script("return window.__xss === undefined;", vec![]);
    assert_eq!((images, xss), (0.into(), true.into()), "{}", b.source());
    assert!(
        b.source().contains("&lt;script&gt;window.__xss=2"),
        "{}",
        b.source()
    );
    // A hostile job name is refused by the API, and the refusal shows it as text.
    b.goto(&format!("{base}/console/submit"));
    let name = b.must_find("#name");
    let unpattern = "arguments[0].removeAttribute('pattern'); return null;";
    b.script(unpattern, vec![name.as_argument()]);
    b.type_into(&name, "<img src=x onerror=window.__xss=3>");
    b.type_into(&b.must_find("#command"), "true");
    b.click(&b.must_find("#submit"));
    b.wait_until("the refusal", WAIT, |b| b.find(".refusal").is_some());
    assert!(
        b.text(&b.must_find(".refusal")).contains("<img src=x"),
        "{}",
        b.source()
    );
    // A hostile filter in the address is echoed into the form as text.
    b.goto(&format!(
        "{base}/console/jobs?name=%22%3E%3Cscript%3Ewindow.__xss%3D4%3C%2Fscript%3E"
    ));
    let echoed = b.script(
        "return document.querySelector('input[name=name]').value;",
        vec![],
    );
    assert_eq!(echoed, "\"><script>window.__xss=4</script>");
    let images = b.script("return document.querySelectorAll('img').length;", vec![]);
    let xss = b.script("return window.__xss === undefined;", vec![]);
    assert_eq!((images, xss), (0.into(), true.into()), "{}", b.source());

    // Submit from the form; the job's page follows it from running to succeeded without a
    // reload (the marker set on the page survives).
    b.goto(&format!("{base}/console/submit"));
    shot(&b, "submit");
    b.type_into(&b.must_find("#name"), "from-the-browser");
    b.type_into(&b.must_find("#command"), "sleep 3; echo finished");
    let gpus = b.must_find("#gpus");
    b.clear(&gpus);
    b.type_into(&gpus, "1");
    b.type_into(&b.must_find("#labels"), "team=vision");
    b.click(&b.must_find("#submit"));
    b.wait_until("the new job's page", WAIT, |b| {
        b.url().contains("/console/jobs/") && b.find("#job-state").is_some()
    });
    let submitted: u64 = b
        .url()
        .rsplit('/')
        .next()
        .and_then(|id| id.parse().ok())
        .expect("the job's id in the url");
    let job = c.job(1, submitted).await.expect("the job exists");
    let spec = job.spec.expect("spec");
    assert_eq!((spec.tenant.as_str(), spec.gpus), ("vision", 1));
    assert_eq!(job.submitted_by.split('.').next(), vision.split('.').next());
    b.script("window.__marker = 42; return null;", vec![]);
    b.wait_until("the job to succeed, shown live", WAIT, |b| {
        shown_state(b) == "succeeded"
    });
    assert_eq!(
        b.script("return window.__marker;", vec![]),
        42,
        "the page reloaded"
    );
    b.wait_until("the job's log", WAIT, |b| {
        b.text(&b.must_find("#log")).contains("finished")
    });
    shot(&b, "job");

    // The jobs table follows new jobs without a reload too.
    b.goto(&format!("{base}/console/jobs"));
    b.script("window.__marker = 7; return null;", vec![]);
    let later = submit_as(
        &c,
        &vision,
        shell_job("appears-live", 0, "sleep 600"),
        false,
    )
    .await;
    b.wait_until("the new job's row", WAIT, |b| {
        b.find(&format!("tr[data-job='{later}']")).is_some()
    });
    assert_eq!(
        b.script("return window.__marker;", vec![]),
        7,
        "the page reloaded"
    );
    shot(&b, "jobs");

    // Cancel from the job's page.
    b.goto(&format!("{base}/console/jobs/{later}"));
    b.wait_until("a running job", WAIT, |b| shown_state(b) == "running");
    b.click(&b.must_find("form[action$='/cancel'] button"));
    b.wait_until("the job cancelled", WAIT, |b| shown_state(b) == "cancelled");
    let cancelled = c.job(1, later).await.expect("job");
    assert_eq!(cancelled.state, pb::JobState::Cancelled as i32);

    // A page of another site posts a cancel to the console: refused, the job runs on.
    let forged = format!(
        "data:text/html,<form id=f method=post action='{base}/console/jobs/{hostile}/cancel'>\
         <input name=csrf value=guess></form><script>document.getElementById('f').submit()</script>"
    );
    b.goto(&forged);
    b.wait_until("the forged post's answer", WAIT, |b| {
        b.url().starts_with(&base)
    });
    let still = c.job(1, hostile).await.expect("job");
    assert!(!still.cancel_requested, "a cross-site form cancelled a job");
    // A post from the console's own origin without the session's form token: refused too.
    b.goto(&format!("{base}/console/jobs/{hostile}"));
    let status = b.script_async(&format!(
        "const done = arguments[arguments.length - 1];
         fetch('/console/jobs/{hostile}/cancel', {{method: 'POST',
             headers: {{'Content-Type': 'application/x-www-form-urlencoded'}}, body: 'csrf=wrong'}})
           .then(r => done([r.status, r.headers.get('x-frame-options'),
                            r.headers.get('content-security-policy')]));"
    ));
    assert_eq!(status[0], 403, "{status}");
    assert_eq!(status[1], "DENY", "{status}");
    assert!(
        status[2]
            .as_str()
            .unwrap_or_default()
            .contains("frame-ancestors 'none'"),
        "{status}"
    );
    assert!(!c.job(1, hostile).await.expect("job").cancel_requested);

    // Revoking the token ends the session at the next click.
    logout(&b);
    let doomed = token(&c, pb::Role::User, "vision", None).await;
    login(&b, &base, &doomed);
    let mut tokens = TokenServiceClient::new(c.channel(1).await.expect("channel"));
    let doomed_id = doomed.split_once('.').expect("id.secret").0.to_owned();
    tokens
        .revoke_token(pb::RevokeTokenRequest { id: doomed_id })
        .await
        .expect("revoked");
    b.wait_until("the revoked session sent to the login", WAIT, |b| {
        b.goto(&format!("{base}/console/jobs"));
        b.url().contains("/console/login")
    });
    assert!(b.source().contains("revoked"), "{}", b.source());
    // An expired token does not log in.
    let brief = token(&c, pb::Role::User, "vision", Some(1)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.goto(&format!("{base}/console/login"));
    b.type_into(&b.must_find("#token"), &brief);
    b.click(&b.must_find("#login button"));
    b.wait_until("the refusal", WAIT, |b| b.find(".refusal").is_some());
    assert!(b.source().contains("expired"), "{}", b.source());

    // The admin sees the nodes (a MIG GPU drawn) and the audit log, with the user's
    // submission in it.
    login(&b, &base, &admin);
    // A GPU split into MIG instances is drawn with its instances inside, the one in use marked.
    let mut gpus = GpuServiceClient::new(c.channel(1).await.expect("channel"));
    let layout = ["3g.40gb", "2g.20gb", "1g.10gb"]
        .map(str::to_owned)
        .to_vec();
    gpus.set_gpu_partition(pb::SetGpuPartitionRequest {
        node_id: 1,
        gpu_index: 3,
        mode: "mig".into(),
        mig: layout,
    })
    .await
    .expect("a MIG layout");
    let sliced = pb::JobSpec {
        mig_profile: "1g.10gb".into(),
        ..shell_job("on-a-slice", 1, "sleep 600")
    };
    submit_as(&c, &vision, sliced, false).await;
    b.goto(&format!("{base}/console/nodes"));
    b.wait_until("the MIG instances drawn, one in use", WAIT, |b| {
        b.goto(&format!("{base}/console/nodes"));
        b.find("[data-gpu='1/3'] .mig .slice.used").is_some()
    });
    // A GPU that raised an alert (a fatal XID here) is marked, and quarantined.
    gpus.inject_fault(pb::InjectFaultRequest {
        node_id: 1,
        gpu_index: 1,
        fault: pb::GpuFault::Xid as i32,
        xid: 79,
    })
    .await
    .expect("a simulated XID");
    b.wait_until("the alerted GPU marked", WAIT, |b| {
        b.goto(&format!("{base}/console/nodes"));
        b.find("[data-gpu='1/1'].alerted.quarantined").is_some()
    });
    shot(&b, "nodes");
    // A GPU's page draws its readings from its agent's own telemetry.
    b.click(&b.must_find("[data-gpu='1/3'] .gpu-head a"));
    b.wait_until("the GPU's charts", WAIT, |b| {
        b.find("figure.chart-line svg path").is_some()
    });
    let charts = "return document.querySelectorAll('figure.chart-line').length;";
    assert_eq!(b.script(charts, vec![]), 4);
    shot(&b, "gpu");

    b.click(&b.must_find("nav a[href='/console/audit']"));
    b.wait_until("the audit page", WAIT, |b| {
        b.url().ends_with("/console/audit")
    });
    assert!(b.source().contains("job.submit"), "{}", b.source());
    shot(&b, "audit");
    // The scheduler page replays this cluster's finished jobs under three policies.
    b.goto(&format!("{base}/console/scheduler"));
    b.click(&b.must_find("#replay"));
    b.wait_until("the replay's results", Duration::from_secs(120), |b| {
        b.find("#replay-results").is_some()
    });
    let results = b.text(&b.must_find("#replay-results table"));
    for policy in ["fcfs+easy", "sjf+easy", "fairshare+easy"] {
        assert!(results.contains(policy), "{results}");
    }
    assert!(
        b.find("#replay-results svg").is_some(),
        "the chart is drawn"
    );
    // A pasted trace: 600 jobs of two tenants, a burst every hour.
    let mut csv = String::from("submit,duration,gpus,tenant\n");
    for i in 0u64..600 {
        let (submit, duration) = (i / 50 * 3600 + i % 50 * 7, 60 + (i * 7919) % 7200);
        let gpus = [1, 1, 2, 4, 8][(i % 5) as usize];
        let tenant = if i % 3 == 0 { "nlp" } else { "vision" };
        csv.push_str(&format!("{submit},{duration},{gpus},{tenant}\n"));
    }
    b.script(
        "document.getElementById('trace').value = arguments[0]; return null;",
        vec![csv.into()],
    );
    b.click(&b.must_find("#replay"));
    b.wait_until(
        "the pasted trace's results",
        Duration::from_secs(120),
        |b| {
            b.find("#replay-results h2")
                .is_some_and(|h| b.text(&h).contains("pasted trace"))
        },
    );
    assert!(
        b.text(&b.must_find("#replay-results table"))
            .contains("600")
    );
    b.script(
        "document.getElementById('replay-results').scrollIntoView(); return null;",
        vec![],
    );
    shot(&b, "scheduler");
    for (page, name) in [
        ("cluster", "cluster"),
        ("tenants", "tenants"),
        ("alerts", "alerts"),
    ] {
        b.goto(&format!("{base}/console/{page}"));
        assert!(b.find("main h1").is_some(), "{}", b.source());
        shot(&b, name);
    }
    // The tenants' last day, drawn from the jobs' records: GPU hours and energy.
    b.goto(&format!("{base}/console/tenants"));
    assert_eq!(b.script(charts, vec![]), 2, "{}", b.source());
    assert!(b.source().contains("vision"), "{}", b.source());
    b.goto(&format!("{base}/console/jobs?state=all"));
    assert!(
        b.source().contains("nlp-secret-run"),
        "the admin sees every tenant's jobs"
    );
}

/// The jobs page over 10,000 jobs in the state: how long it takes to paint (printed, not
/// asserted: a measurement, on whatever machine runs it), and its pages walked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_page_over_ten_thousand_jobs_paints_and_pages() {
    if !webdriver::available() {
        return;
    }
    const JOBS: usize = 10_000;
    const CLIENTS: usize = 32;
    // The fill goes faster than one token's (or one source's) request rate allows.
    let c = Cluster::start(
        1,
        1,
        "[api]\nrequests_per_second = 0\nsource_requests_per_second = 0\n",
    )
    .await;
    let base = format!("https://{}", c.addr(1));
    let admin = c.admin_token();
    let started = std::time::Instant::now();
    let mut writers = Vec::new();
    for w in 0..CLIENTS {
        let channel = c.channel(1).await.expect("channel");
        writers.push(tokio::spawn(async move {
            let mut jobs = JobServiceClient::new(channel);
            for i in (w..JOBS).step_by(CLIENTS) {
                let spec = pb::JobSpec {
                    tenant: "bulk".into(),
                    ..shell_job(&format!("bulk-{i}"), 1, "true")
                };
                let req = pb::SubmitJobRequest {
                    spec: Some(spec),
                    idempotency_key: format!("bulk-{i}"),
                    hold: true,
                };
                jobs.submit_job(req).await.expect("submitted");
            }
        }));
    }
    for w in writers {
        w.await.expect("writer");
    }
    eprintln!("submitted {JOBS} held jobs in {:?}", started.elapsed());

    let b = Browser::start();
    login(&b, &base, &admin);
    let mut paints = Vec::new();
    for _ in 0..3 {
        b.goto(&format!("{base}/console/jobs?state=all"));
        let ms = b.script(
            "const n = performance.getEntriesByType('navigation')[0];
             return n.loadEventEnd - n.startTime;",
            vec![],
        );
        paints.push(ms.as_f64().expect("a time"));
    }
    eprintln!("console jobs page over {JOBS} jobs: loaded in {paints:?} ms");
    let first_row = |b: &Browser| {
        b.script(
            "return document.querySelector('#job-rows tr[data-job]').dataset.job;",
            vec![],
        )
    };
    let mut seen = vec![first_row(&b)];
    for _ in 0..3 {
        b.click(&b.must_find("#next-page"));
        b.wait_until("the next page", WAIT, |b| {
            first_row(b) != *seen.last().expect("a page")
        });
        seen.push(first_row(&b));
    }
    let rows = b.script(
        "return document.querySelectorAll('#job-rows tr[data-job]').length;",
        vec![],
    );
    assert_eq!(rows, 50, "a page holds 50 jobs");
    eprintln!("pages began at jobs {seen:?}");
    assert!(b.url().contains("before="), "{}", b.url());
    // Newest first, 50 a page.
    let firsts: Vec<u64> = (seen.iter())
        .map(|v| v.as_str().and_then(|s| s.parse().ok()).expect("an id"))
        .collect();
    assert_eq!(firsts, [10_000, 9_950, 9_900, 9_850], "{seen:?}");
}
