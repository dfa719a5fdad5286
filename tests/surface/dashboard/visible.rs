//! Bidi and invisible characters in lock names and holders: the
//! server-rendered pages show them as marked `\u{…}` escapes, while the
//! JSON and the forms keep the text as it is (the live pages escape in
//! app.js; dashboard-tests/ checks those in a browser).

use super::*;

/// `pay\u{202E}gnp.exe`: shown raw, the right-to-left override makes it read
/// "payexe.png".
const NAME: &str = "pay\u{202E}gnp.exe";
const HOLDER: &str = "svc\u{2066}\u{200B}-1";
const MARKED_RLO: &str = "<span class=\"esc\" title=\"U+202E\">\\u{202E}</span>";

/// The page with its form fields taken out: what a reader sees.
fn shown(page: &str) -> String {
    let mut out = String::new();
    let mut rest = page;
    while let Some(at) = rest.find("value=\"") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 7..];
        rest = &after[after.find('"').unwrap() + 1..];
    }
    out.push_str(rest);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_pages_show_bidi_and_invisible_characters_escaped() {
    let redis = start_redis();
    let server = DashServer::start(&redis.url(), true).await;
    let mut client = server.client().await;
    let grant = client
        .acquire(acquire(NAME, HOLDER))
        .await
        .unwrap()
        .into_inner()
        .grant
        .unwrap();

    // The force-release confirmation, rendered by the server.
    let query = format!(
        "/dashboard/release?name={}&holder={}",
        url_encode(NAME),
        url_encode(HOLDER)
    );
    let (status, page) = server.get(&query).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains(&format!("<code>pay{MARKED_RLO}gnp.exe</code>")),
        "{page}"
    );
    assert!(
        page.contains("svc<span class=\"esc\" title=\"U+2066\">\\u{2066}</span><span class=\"esc\" title=\"U+200B\">\\u{200B}</span>-1"),
        "{page}"
    );
    let text = shown(&page);
    for hidden in ['\u{202E}', '\u{2066}', '\u{200B}'] {
        assert!(!text.contains(hidden), "{hidden:?} shown raw in {text}");
    }
    // The form still posts the real name and holder.
    assert!(
        page.contains(&format!("name=\"name\" value=\"{NAME}\"")),
        "{page}"
    );
    assert!(
        page.contains(&format!("name=\"holder\" value=\"{HOLDER}\"")),
        "{page}"
    );

    // Posting it releases that grant; the result page escapes too.
    let form = format!(
        "name={}&holder={}&fencing_token={}&confirm=yes",
        url_encode(NAME),
        url_encode(HOLDER),
        grant.fencing_token
    );
    let (status, page) = server
        .post_form("/dashboard/admin/release", &[], &form)
        .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("was released"), "{page}");
    assert!(page.contains(MARKED_RLO), "{page}");
    assert!(!shown(&page).contains('\u{202E}'), "{page}");
    let state = client.inspect(inspect(NAME)).await.unwrap().into_inner();
    assert!(state.holders.is_empty(), "released: {state:?}");

    // The JSON keeps names as they are (app.js escapes what it shows).
    client.acquire(acquire(NAME, HOLDER)).await.unwrap();
    let (status, json) = server
        .get_json(&format!("/api/v1/locks/{}", url_encode(NAME)))
        .await;
    assert_eq!(status, 200);
    assert_eq!(json["name"], NAME);
    assert_eq!(json["holders"][0]["grant"]["holder"], HOLDER);
}
