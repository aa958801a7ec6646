//! The HTML document every console page is: its head (stylesheet, script) around a body. A
//! page without navigation (the login, a refusal) is just this.

use axum::response::Html;
use maud::{DOCTYPE, Markup, html};

/// A whole document of `title` around `body`.
pub(super) fn document(title: &str, body: Markup) -> Html<String> {
    Html(
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) }
                    link rel="stylesheet" href="/console/assets/console.css";
                    script src="/console/assets/console.js" defer {}
                }
                body { (body) }
            }
        }
        .into_string(),
    )
}
