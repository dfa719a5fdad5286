//! `lua/dequeue.lua`: a waiting request leaves the queue.

use redis::Value;

use super::{Noted, Reply};
use crate::store::StoreError;

pub struct Call<'a> {
    pub id: &'a str,
    pub watched: super::Emit,
}

impl Call<'_> {
    pub fn args(&self) -> Vec<String> {
        vec![self.id.to_owned(), self.watched.arg()]
    }
}

/// The place it had (0: it was not queued) and the kind it waited as.
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
