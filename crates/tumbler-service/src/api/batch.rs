//! Batch: several independent Acquire, Release and Extend calls in one
//! request (decision 0087). Each item runs through its own call's handler
//! body, so it is read, checked against the caller's namespaces, reported
//! and answered exactly as that call would be. Items on one lock run one
//! after another in the request's order; items on different locks run
//! together, so those of one namespace reach Redis in a few group-commit
//! calls.
//!
//! What is refused whole, before any item runs: no items, more than
//! [`MAX_ITEMS`], an item with no call, an Acquire that would wait (a
//! batch answers when its slowest item does, and a wait would hold the
//! others' answers), and a caller past its request rate (each item counts
//! as one call).

use std::collections::HashMap;

use futures::future::join_all;
use tonic::{Request, Response, Status};

use super::LockApi;
use super::locks::grpc_deadline;
use crate::auth::Access;
use crate::engine;
use crate::errors::invalid;
use crate::observe::CallerDeadline;
use crate::proto::{self, batch_item::Call, batch_result::Result as Answer};

/// The most items one batch may carry: its Redis work is at most this many
/// calls' (DESIGN.md invariant 17).
pub const MAX_ITEMS: usize = 256;

impl LockApi {
    pub(super) async fn batch_rpc(
        &self,
        request: Request<proto::BatchRequest>,
    ) -> Result<Response<proto::BatchResponse>, Status> {
        let access = Access::of(&request)?;
        let deadline = grpc_deadline(&request);
        let items = request.into_inner().items;
        let calls = checked(items)?;
        // The request itself was charged one call when it was
        // authenticated; each further item is charged one more.
        if let Access::Token(token) = &access {
            for _ in 1..calls.len() {
                token.charge()?;
            }
        }
        let count = calls.len();
        let runs = by_lock(calls).into_iter().map(|run| {
            let access = &access;
            async move {
                let mut answers = Vec::with_capacity(run.len());
                for (i, call) in run {
                    answers.push((i, self.batch_item(call, access, deadline).await));
                }
                answers
            }
        });
        let mut results = vec![proto::BatchResult::default(); count];
        for (i, answer) in join_all(runs).await.into_iter().flatten() {
            results[i] = answer;
        }
        Ok(Response::new(proto::BatchResponse { results }))
    }

    /// One item, answered as its own call would be.
    async fn batch_item(
        &self,
        call: Call,
        access: &Access,
        deadline: Option<CallerDeadline>,
    ) -> proto::BatchResult {
        let answer = match call {
            Call::Acquire(req) => (self.acquire_rpc(item(req, access, deadline)).await)
                .map(|r| Answer::Acquire(r.into_inner())),
            Call::Release(req) => (self.release_rpc(item(req, access, deadline)).await)
                .map(|r| Answer::Release(r.into_inner())),
            Call::Extend(req) => (self.extend_rpc(item(req, access, deadline)).await)
                .map(|r| Answer::Extend(r.into_inner())),
        };
        proto::BatchResult {
            result: Some(answer.unwrap_or_else(|status| {
                Answer::Error(proto::BatchError {
                    code: status.code() as i32,
                    message: status.message().to_owned(),
                })
            })),
        }
    }
}

/// The batch's calls, or why it is refused whole.
fn checked(items: Vec<proto::BatchItem>) -> Result<Vec<Call>, Status> {
    if items.is_empty() {
        return Err(invalid(engine::Invalid::new("items", "must not be empty")));
    }
    if items.len() > MAX_ITEMS {
        return Err(invalid(engine::Invalid::new(
            "items",
            format!("at most {MAX_ITEMS} in one batch, not {}", items.len()),
        )));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| match item.call {
            None => Err(invalid(engine::Invalid::new(
                "items",
                format!("items[{i}] names no call (acquire, release or extend)"),
            ))),
            Some(Call::Acquire(req)) if req.wait_ms > 0 => Err(invalid(engine::Invalid::new(
                "items",
                format!(
                    "items[{i}].acquire.wait_ms is {}: an Acquire in a batch tries once (wait_ms 0)",
                    req.wait_ms
                ),
            ))),
            Some(call) => Ok(call),
        })
        .collect()
}

/// The calls in runs, one per lock (its namespace and its name, or a
/// multi-lock's names), each in the request's order, with their indexes.
fn by_lock(calls: Vec<Call>) -> Vec<Vec<(usize, Call)>> {
    let mut runs: Vec<Vec<(usize, Call)>> = Vec::new();
    let mut run_of: HashMap<(String, String), usize> = HashMap::new();
    for (i, call) in calls.into_iter().enumerate() {
        let (namespace, name, names) = match &call {
            Call::Acquire(r) => (&r.namespace, &r.name, &r.names),
            Call::Release(r) => (&r.namespace, &r.name, &r.names),
            Call::Extend(r) => (&r.namespace, &r.name, &r.names),
        };
        let name = if names.is_empty() {
            name.clone()
        } else {
            names.join("\n")
        };
        let namespace = if namespace.is_empty() {
            "default"
        } else {
            namespace.as_str()
        };
        let run = *run_of
            .entry((namespace.to_owned(), name))
            .or_insert_with(|| {
                runs.push(Vec::new());
                runs.len() - 1
            });
        runs[run].push((i, call));
    }
    runs
}

/// An item as a request of its own, with the batch's access and deadline.
fn item<T>(message: T, access: &Access, deadline: Option<CallerDeadline>) -> Request<T> {
    let mut request = Request::new(message);
    request.extensions_mut().insert(access.clone());
    if let Some(deadline) = deadline {
        request.extensions_mut().insert(deadline);
    }
    request
}
