//! `lua/wait_end.lua`: a holder's edges leave its namespace's wait-for
//! registry when its wait ends (decision 0077).

use redis::Value;

use crate::store::StoreError;

pub fn args(holder: &str, request: &str) -> Vec<String> {
    vec![holder.to_owned(), request.to_owned()]
}

/// True when the request's edges were there and are gone.
pub fn parse(value: Value) -> Result<bool, StoreError> {
    match value {
        Value::Int(n) => Ok(n == 1),
        other => Err(StoreError::Protocol(format!("wait_end answered {other:?}"))),
    }
}
