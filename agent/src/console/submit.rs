//! The submit form: a job as a shell command line with its GPUs, time limit, priority, image
//! and labels. The form carries an idempotency key made when it was drawn, so a form posted
//! twice (a double click, a reload) submits one job.

use axum::Form;
use axum::extract::State;
use axum::response::{IntoResponse, Redirect};
use gpu_proto::v1 as pb;
use gpu_proto::v1::job_service_server::JobService;
use maud::html;
use serde::Deserialize;
use tonic::Status;

use super::Shared;
use super::failure::{Failure, Page};
use super::session::Session;
use super::view::{self, Section};

pub(super) async fn page(session: Session) -> Page {
    let key = hex::encode(rand::random::<[u8; 12]>());
    let body = html! {
        form.submit method="post" action="/console/submit" {
            input type="hidden" name="csrf" value=(session.csrf);
            input type="hidden" name="key" value=(key);
            label { "Name" input #name name="name" required pattern="[A-Za-z0-9._-]+" placeholder="train-resnet"; }
            label { "Tenant" input #tenant name="tenant" value=(session.who.tenant) placeholder="default"; }
            label.wide { "Command " span.hint { "(run by sh -c)" }
                input #command name="command" required placeholder="python train.py --epochs 3"; }
            label { "GPUs" input #gpus name="gpus" type="number" min="0" max="1024" value="1"; }
            label { "Time limit" input #time_limit name="time_limit" placeholder="2h"; }
            label { "Priority" input #priority name="priority" type="number"; }
            label { "Container image" input #image name="image" placeholder="(none: on the host)"; }
            label.wide { "Labels" input #labels name="labels" placeholder="team=vision, sweep=7"; }
            button #submit type="submit" { "Submit" }
        }
    };
    Ok(view::page(&session, Section::Submit, "Submit a job", body))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct SubmitForm {
    csrf: String,
    key: String,
    name: String,
    tenant: String,
    command: String,
    gpus: String,
    time_limit: String,
    priority: String,
    image: String,
    labels: String,
}

pub(super) async fn submit(
    State(apis): State<Shared>,
    session: Session,
    Form(form): Form<SubmitForm>,
) -> Page {
    session.check_csrf(&form.csrf)?;
    let req = request(form).map_err(|e| Failure(Status::invalid_argument(e)))?;
    let answer = apis
        .job
        .submit_job(session.request(req))
        .await?
        .into_inner();
    Ok(Redirect::to(&format!("/console/jobs/{}", answer.job_id)).into_response())
}

/// The API's submission for a filled form (the API validates the job itself).
fn request(f: SubmitForm) -> Result<pb::SubmitJobRequest, String> {
    let command = f.command.trim();
    if command.is_empty() {
        return Err("a job needs a command".into());
    }
    let number = |what: &str, text: &str| -> Result<Option<i64>, String> {
        let text = text.trim();
        (!text.is_empty())
            .then(|| {
                text.parse::<i64>()
                    .map_err(|_| format!("{what}: {text:?} is not a whole number"))
            })
            .transpose()
    };
    let gpus = number("GPUs", &f.gpus)?.unwrap_or(0);
    let gpus = u32::try_from(gpus).map_err(|_| format!("GPUs: {gpus} is out of range"))?;
    let priority = number("priority", &f.priority)?
        .map(|p| i32::try_from(p).map_err(|_| format!("priority: {p} is out of range")))
        .transpose()?;
    let time_limit = f.time_limit.trim();
    let wall_time_limit_s = (!time_limit.is_empty())
        .then(|| {
            humantime::parse_duration(time_limit)
                .map(|d| d.as_secs())
                .map_err(|e| format!("time limit {time_limit:?}: {e} (e.g. 90m, 2h)"))
        })
        .transpose()?;
    let mut labels = std::collections::HashMap::new();
    for pair in f.labels.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("label {pair:?}: write key=value"))?;
        labels.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    let image = f.image.trim();
    let spec = pb::JobSpec {
        name: f.name.trim().to_owned(),
        tenant: f.tenant.trim().to_owned(),
        command: vec!["sh".into(), "-c".into(), command.to_owned()],
        gpus,
        priority,
        wall_time_limit_s,
        labels,
        container: (!image.is_empty()).then(|| pb::ContainerSpec {
            image: image.to_owned(),
            mounts: Vec::new(),
        }),
        ..pb::JobSpec::default()
    };
    Ok(pb::SubmitJobRequest {
        spec: Some(spec),
        idempotency_key: f.key,
        hold: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_becomes_a_submission() {
        let form = SubmitForm {
            name: "train".into(),
            command: "python train.py; echo done".into(),
            gpus: "2".into(),
            time_limit: "90m".into(),
            labels: "team=vision, sweep = 7".into(),
            key: "k1".into(),
            ..SubmitForm::default()
        };
        let req = request(form).expect("valid");
        let spec = req.spec.expect("spec");
        assert_eq!(spec.command, ["sh", "-c", "python train.py; echo done"]);
        assert_eq!((spec.gpus, spec.wall_time_limit_s), (2, Some(5400)));
        assert_eq!(spec.labels.get("sweep").map(String::as_str), Some("7"));
        assert_eq!(req.idempotency_key, "k1");
    }

    #[test]
    fn bad_fields_are_named() {
        let with = |f: fn(&mut SubmitForm)| {
            let mut form = SubmitForm {
                command: "true".into(),
                ..SubmitForm::default()
            };
            f(&mut form);
            request(form).expect_err("refused")
        };
        assert!(with(|f| f.gpus = "two".into()).contains("GPUs"));
        assert!(with(|f| f.gpus = "-1".into()).contains("GPUs"));
        assert!(with(|f| f.time_limit = "soon".into()).contains("time limit"));
        assert!(with(|f| f.labels = "team".into()).contains("key=value"));
        assert!(with(|f| f.command = " ".into()).contains("command"));
    }
}
