//! `tumbler health`: asks a server's grpc.health.v1 service whether it
//! serves (exit 0) or not (exit 69: NOT_SERVING, e.g. Redis unreachable,
//! or no answer at all), as a probe or a `helm test` step would. A
//! NOT_SERVING answer says why (the server's `tumbler-reason` header: the
//! same reason its log and its RPCs' UNAVAILABLE give).

use clap::Args;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::connect::{Conn, Target};
use super::{Failure, Globals, exit};

#[derive(Args, Debug)]
pub struct HealthArgs {
    #[command(flatten)]
    pub target: Target,
    /// The service to ask about: "" (the default) is the server as a whole,
    /// SERVING only while Redis answers; `tumbler.v1.LockService` is the
    /// same; `liveness` is SERVING while the process runs.
    #[arg(long, default_value = "")]
    pub service: String,
}

pub async fn run(args: HealthArgs, globals: &Globals) -> Result<u8, Failure> {
    let mut conn = Conn::new(&args.target)?;
    let channel = conn.channel().await?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: args.service.clone(),
        })
        .await?;
    let reason = reply
        .metadata()
        .get(tumbler_proto::metadata::HEALTH_REASON)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let status = reply.into_inner().status();
    let name = status.as_str_name();
    let mut answer = serde_json::json!({
        "endpoint": conn.endpoint(),
        "service": args.service,
        "status": name,
    });
    if let Some(reason) = &reason {
        answer["reason"] = reason.clone().into();
    }
    globals.output().reply(&answer, || match &reason {
        Some(reason) => format!("{name}: {reason}\n"),
        None => format!("{name}\n"),
    })?;
    Ok(if status == ServingStatus::Serving {
        exit::SUCCESS
    } else {
        exit::UNREACHABLE
    })
}
