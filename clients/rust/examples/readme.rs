//! The example of clients/rust/README.md, compiled (tests/repo/crates.rs
//! checks that the two are the same).

use std::time::Duration;
use tumbler_client::{Client, Error};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = Client::builder("127.0.0.1:50051")
        .namespace("billing")
        .connect()
        .await?;

    // A guard: waits up to 10 s in the server's queue; the watchdog renews
    // the 3 s lease every second while the guard lives; released on drop.
    let lock = client
        .lock("invoices/42")
        .wait(Duration::from_secs(10))
        .ttl(Duration::from_secs(3))
        .acquire()
        .await?;
    println!(
        "holding invoices/42 with fencing token {}",
        lock.fencing_token()
    );
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_secs(5)) => {} // the work
        lost = lock.lost() => return Err(lost),              // stop: someone else may hold it
    }
    lock.release().await?;

    // The scoped form: the body is dropped at once if the grant is lost.
    let token = client
        .lock("reports")
        .ttl(Duration::from_secs(3))
        .run(async |lock| lock.fencing_token())
        .await?;
    println!("reports ran under token {token}");
    Ok(())
}
