//! `lua/dequeue.lua`: a waiting request leaves the queue.

use redis::Value;

use super::{Noted, Reply};
use crate::store::StoreError;

pub struct Call<'a> {
    pub id: &'a str,
    pub watched: super::Emit,
    /// The request that leaves (its RPC's id, as acquire stored it): a
    /// place another request of the holder took over is left alone.
    /// None: whichever request holds the place.
    pub request: Option<&'a str>,
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        let mut args = vec![self.id.to_owned(), self.watched.arg()];
        if let Some(request) = self.request {
            args.push(request.to_owned());
        }
        args
    }
}

/// The place it had (0: it was not queued, or the place is another
/// request's) and the kind it waited as.
#[derive(Debug)]
pub struct Answer {
    pub now: i64,
    pub position: u32,
    pub kind: String,
    pub noted: Vec<Noted>,
}

pub fn parse(value: Value) -> Result<Answer, StoreError> {
    let mut reply = Reply::new("dequeue", value)?;
    Ok(Answer {
        now: reply.take()?,
        position: reply.take()?,
        kind: reply.take()?,
        noted: reply.noted()?,
    })
}
