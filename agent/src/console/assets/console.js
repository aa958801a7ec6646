// gpumesh console: the few things a server-rendered page cannot do alone.
// - [data-watch] + [data-rows]: an EventSource on data-watch; when it names changed jobs, the
//   element's content is fetched again from data-rows (HTML rendered and escaped by the
//   server) and swapped in, at most once per 300 ms.
// - [data-log]: an EventSource of a job's log; each event's text is appended as text, never
//   as HTML, and only the last 256 KiB are kept; a job with no log yet is asked again.
// - The login page's link form (#token=<id>.<secret> after the URL): the token is taken from
//   the fragment (which never reaches a server or a log), removed from the address bar, and
//   the form submitted.
"use strict";

(function () {
  function watch(el) {
    var source = new EventSource(el.dataset.watch);
    var timer = null;
    function refresh() {
      timer = null;
      fetch(el.dataset.rows, { credentials: "same-origin" })
        .then(function (r) {
          if (r.redirected || r.status === 401 || r.status === 403) {
            window.location.reload();
            return null;
          }
          return r.ok ? r.text() : null;
        })
        .then(function (html) {
          if (html !== null) {
            el.innerHTML = html;
            el.dataset.refreshed = String(Date.now());
          }
        });
    }
    source.addEventListener("jobs", function () {
      if (timer === null) timer = setTimeout(refresh, 300);
    });
    window.addEventListener("beforeunload", function () { source.close(); });
  }

  function follow(pre) {
    var limit = 256 * 1024;
    function open() {
      var source = new EventSource(pre.dataset.log);
      var fresh = true;
      source.addEventListener("log", function (e) {
        var text = (fresh ? "" : pre.textContent) + JSON.parse(e.data);
        fresh = false;
        pre.textContent = text.length > limit ? text.slice(text.length - limit) : text;
        pre.scrollTop = pre.scrollHeight;
      });
      source.addEventListener("end", function () { source.close(); });
      // No log yet (the job waits), or the stream broke: say so, and try again from the start.
      source.addEventListener("failed", function (e) {
        source.close();
        pre.dataset.note = e.data;
        setTimeout(open, 2000);
      });
      window.addEventListener("beforeunload", function () { source.close(); });
    }
    open();
  }

  function loginLink() {
    var form = document.getElementById("login");
    var m = /(?:^#|&)token=([A-Za-z0-9]+\.[A-Za-z0-9]+)/.exec(window.location.hash);
    if (!form || !m) return;
    history.replaceState(null, "", window.location.pathname);
    document.getElementById("token").value = m[1];
    form.submit();
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("[data-watch][data-rows]").forEach(watch);
    document.querySelectorAll("pre[data-log]").forEach(follow);
    loginLink();
  });
})();
