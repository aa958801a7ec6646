//! A small W3C WebDriver client for the console's browser tests: it starts Debian's
//! `chromedriver` (which starts a headless `chromium`) and speaks the protocol's JSON over
//! HTTP/1.1 on loopback. Only the calls the tests use.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The key W3C WebDriver names an element reference with.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Whether chromium and chromedriver are installed; when `GPUMESH_REQUIRE_BROWSER=1` (CI)
/// their absence fails the test instead of skipping it.
pub fn available() -> bool {
    let here = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let (chromium, driver) = (here("chromium"), here("chromedriver"));
    if chromium && driver {
        return true;
    }
    assert!(
        std::env::var_os("GPUMESH_REQUIRE_BROWSER").is_none_or(|v| v != "1"),
        "GPUMESH_REQUIRE_BROWSER=1 but chromium {chromium}, chromedriver {driver}"
    );
    eprintln!("SKIPPED: the console's browser tests need chromium and chromedriver");
    false
}

/// A chromedriver process with one browser session; both end when it is dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

/// A page element, by its WebDriver reference.
#[derive(Clone, Debug)]
pub struct Element(String);

impl Browser {
    /// Start chromedriver and a headless chromium that accepts the cluster's own CA.
    pub fn start() -> Browser {
        let port = crate::free_addr()
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .expect("a free port");
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
        };
        let started = Instant::now();
        while browser.call("GET", "/status", None).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not answer"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": { "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1000",
            ] },
        } } });
        let answer = browser
            .call("POST", "/session", Some(caps))
            .expect("a browser session");
        browser.session = answer["sessionId"]
            .as_str()
            .expect("a session id")
            .to_owned();
        browser
    }

    fn at(&self, path: &str) -> String {
        format!("/session/{}{path}", self.session)
    }

    /// Load `url` and wait for the page.
    pub fn goto(&self, url: &str) {
        self.call("POST", &self.at("/url"), Some(json!({ "url": url })))
            .unwrap_or_else(|e| panic!("load {url}: {e}"));
    }

    pub fn url(&self) -> String {
        self.call("GET", &self.at("/url"), None)
            .expect("the current url")
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    pub fn source(&self) -> String {
        self.call("GET", &self.at("/source"), None)
            .expect("the page source")
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The first element `css` selects, if any.
    pub fn find(&self, css: &str) -> Option<Element> {
        let query = json!({ "using": "css selector", "value": css });
        let found = self.call("POST", &self.at("/element"), Some(query)).ok()?;
        found[ELEMENT].as_str().map(|id| Element(id.to_owned()))
    }

    pub fn must_find(&self, css: &str) -> Element {
        self.find(css)
            .unwrap_or_else(|| panic!("no {css} on {}:\n{}", self.url(), self.source()))
    }

    pub fn text(&self, e: &Element) -> String {
        let answer = self.call("GET", &self.at(&format!("/element/{}/text", e.0)), None);
        answer
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    pub fn click(&self, e: &Element) {
        self.call(
            "POST",
            &self.at(&format!("/element/{}/click", e.0)),
            Some(json!({})),
        )
        .expect("click");
    }

    pub fn type_into(&self, e: &Element, text: &str) {
        let body = json!({ "text": text });
        self.call(
            "POST",
            &self.at(&format!("/element/{}/value", e.0)),
            Some(body),
        )
        .expect("type");
    }

    pub fn clear(&self, e: &Element) {
        self.call(
            "POST",
            &self.at(&format!("/element/{}/clear", e.0)),
            Some(json!({})),
        )
        .expect("clear");
    }

    /// Run `script` (a function body; `arguments` holds `args`) in the page; its return value.
    pub fn script(&self, script: &str, args: Vec<Value>) -> Value {
        let body = json!({ "script": script, "args": args });
        self.call("POST", &self.at("/execute/sync"), Some(body))
            .unwrap_or_else(|e| panic!("script {script}: {e}"))
    }

    /// Run `script`, which calls its last argument with its answer.
    pub fn script_async(&self, script: &str) -> Value {
        let body = json!({ "script": script, "args": [] });
        self.call("POST", &self.at("/execute/async"), Some(body))
            .unwrap_or_else(|e| panic!("script {script}: {e}"))
    }

    /// The visible page as PNG.
    pub fn screenshot(&self) -> Vec<u8> {
        use base64::Engine as _;
        let data = self
            .call("GET", &self.at("/screenshot"), None)
            .expect("a screenshot");
        base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap_or_default())
            .expect("base64 PNG")
    }

    /// Wait until `check` holds (polling every 100 ms), or panic saying `what` with the page.
    pub fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&Browser) -> bool,
    ) {
        let started = Instant::now();
        while !check(self) {
            assert!(
                started.elapsed() < timeout,
                "timed out waiting for {what} on {}:\n{}",
                self.url(),
                self.source()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One WebDriver command: its `value`, or the driver's error.
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| e.to_string())?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        let (head, payload) = read_answer(&mut stream)?;
        let answer: Value =
            serde_json::from_str(&payload).map_err(|e| format!("{e}: {payload}"))?;
        let value = answer.get("value").cloned().unwrap_or(Value::Null);
        if head.starts_with("HTTP/1.1 2") {
            Ok(value)
        } else {
            Err(format!("{} {}", value["error"], value["message"]))
        }
    }
}

/// An HTTP/1.1 answer's head and body: chromedriver keeps the connection open, so the body
/// is read to its `Content-Length` (or its last chunk), not to the end of the stream.
fn read_answer(stream: &mut TcpStream) -> Result<(String, String), String> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let lower = head.to_ascii_lowercase();
        let length = lower.lines().find_map(|l| {
            l.strip_prefix("content-length:")
                .and_then(|v| v.trim().parse::<usize>().ok())
        });
        let done = match length {
            Some(len) => body.len() >= len,
            None => lower.contains("chunked") && body.ends_with("0\r\n\r\n"),
        };
        if done {
            let body = if length.is_none() {
                dechunk(body)
            } else {
                body.to_owned()
            };
            return Ok((head.to_owned(), body));
        }
    }
    Err("the connection closed before a whole answer".into())
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

impl Element {
    /// This element as an argument of `Browser::script` (`arguments[i]` in the page).
    pub fn as_argument(&self) -> Value {
        json!({ ELEMENT: self.0 })
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
