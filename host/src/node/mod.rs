//! `stockade node`: one machine's linux substrate served to fronts over the network
//! (issue 23). [`protocol`] is the contract, [`auth`] the request signing.

pub mod auth;
pub mod protocol;
