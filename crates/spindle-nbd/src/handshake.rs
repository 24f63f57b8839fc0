//! Fixed-newstyle handshake and option haggling.
//!
//! Invariants: the server never sends anything but option replies after the greeting until
//! `NBD_OPT_GO`/`NBD_OPT_EXPORT_NAME` succeeds; option data is read into memory only up to
//! [`MAX_OPTION_BYTES`] (larger options are drained and refused with `NBD_REP_ERR_TOO_BIG`);
//! a protocol violation the spec does not let us answer ends the connection (`Ok(None)`).

use std::io;
use std::sync::Arc;

use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf, WriteHalf,
};
use tracing::{debug, warn};

use crate::device::{BlockDevice, DeviceError, Exports};
use crate::proto::*;
use crate::server::{bump, NbdServer};

/// Largest option payload the server reads into memory.
pub(crate) const MAX_OPTION_BYTES: u32 = 64 * 1024;

/// Context id we give `base:allocation` when it is selected.
pub(crate) const BASE_ALLOCATION_ID: u32 = 1;

/// What the handshake agreed on.
pub(crate) struct Session<D> {
    pub device: Arc<D>,
    pub export_name: String,
    pub structured: bool,
    /// Context id for BLOCK_STATUS replies, if `base:allocation` was selected.
    pub base_allocation: Option<u32>,
    pub transmission_flags: u16,
}

pub(crate) fn transmission_flags<D: BlockDevice>(dev: &D, structured: bool) -> u16 {
    let mut f = NBD_FLAG_HAS_FLAGS
        | NBD_FLAG_SEND_FLUSH
        | NBD_FLAG_SEND_FUA
        | NBD_FLAG_SEND_TRIM
        | NBD_FLAG_SEND_WRITE_ZEROES
        | NBD_FLAG_SEND_FAST_ZERO
        | NBD_FLAG_SEND_CACHE;
    if structured {
        f |= NBD_FLAG_SEND_DF;
    }
    if dev.multi_conn_consistent() {
        f |= NBD_FLAG_CAN_MULTI_CONN;
    }
    if dev.read_only() {
        f |= crate::proto::NBD_FLAG_READ_ONLY;
    }
    f
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes).await?;
    w.flush().await
}

async fn reply<W: AsyncWrite + Unpin>(
    w: &mut W,
    option: u32,
    rep: u32,
    data: &[u8],
) -> io::Result<()> {
    send(w, &option_reply(option, rep, data)).await
}

/// Error reply with a human-readable message (clients print it).
async fn reply_err<W: AsyncWrite + Unpin>(
    w: &mut W,
    option: u32,
    rep: u32,
    msg: &str,
) -> io::Result<()> {
    reply(
        w,
        option,
        rep,
        truncate_utf8(msg, MAX_STRING_BYTES).as_bytes(),
    )
    .await
}

fn open_error_reply(e: &DeviceError) -> u32 {
    match e {
        DeviceError::Invalid(_) => NBD_REP_ERR_UNKNOWN,
        DeviceError::NotPermitted(_) => NBD_REP_ERR_POLICY,
        DeviceError::Io(_) | DeviceError::NoSpace(_) => NBD_REP_ERR_PLATFORM,
    }
}

/// Runs the handshake. `Ok(None)` = the session ended without entering transmission
/// (client abort, disconnect, or a protocol violation that closes the connection).
pub(crate) async fn negotiate<E, S>(
    server: &NbdServer<E>,
    rd: &mut BufReader<ReadHalf<S>>,
    wr: &mut WriteHalf<S>,
) -> io::Result<Option<Session<E::Device>>>
where
    E: Exports,
    S: AsyncRead + AsyncWrite + Send,
{
    let mut greeting = [0u8; 18];
    greeting[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    greeting[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    greeting[16..18].copy_from_slice(&(NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES).to_be_bytes());
    send(wr, &greeting).await?;

    let client_flags = rd.read_u32().await?;
    if client_flags & !(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES) != 0
        || client_flags & NBD_FLAG_C_FIXED_NEWSTYLE == 0
    {
        warn!(
            client_flags,
            "nbd client flags unsupported (need fixed newstyle); closing"
        );
        bump(&server.counters.protocol_errors, 1);
        return Ok(None);
    }
    let no_zeroes = client_flags & NBD_FLAG_C_NO_ZEROES != 0;

    let mut structured = false;
    // (export name the selection applies to, base:allocation selected)
    let mut meta: Option<(String, bool)> = None;

    loop {
        let magic = match rd.read_u64().await {
            Ok(m) => m,
            // Client hung up between options: nothing to do.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(e) => return Err(e),
        };
        if magic != IHAVEOPT {
            warn!(magic, "nbd option with bad magic; closing");
            bump(&server.counters.protocol_errors, 1);
            return Ok(None);
        }
        let option = rd.read_u32().await?;
        let len = rd.read_u32().await?;
        if len > MAX_OPTION_BYTES {
            if option == NBD_OPT_EXPORT_NAME {
                // EXPORT_NAME cannot be answered with an error: the spec says close.
                warn!(len, "nbd NBD_OPT_EXPORT_NAME too long; closing");
                bump(&server.counters.protocol_errors, 1);
                return Ok(None);
            }
            let drained =
                tokio::io::copy(&mut (&mut *rd).take(u64::from(len)), &mut tokio::io::sink())
                    .await?;
            if drained != u64::from(len) {
                return Ok(None);
            }
            reply_err(wr, option, NBD_REP_ERR_TOO_BIG, "option data too long").await?;
            continue;
        }
        let mut data = vec![0u8; len as usize];
        rd.read_exact(&mut data).await?;
        debug!(option, len, "nbd option");

        match option {
            NBD_OPT_EXPORT_NAME => {
                let Ok(name) = String::from_utf8(data) else {
                    bump(&server.counters.protocol_errors, 1);
                    return Ok(None);
                };
                let device = match server.exports.open(&name).await {
                    Ok(d) => d,
                    Err(e) => {
                        // No error reply exists for EXPORT_NAME: close.
                        debug!(export = %name, error = %e, "nbd EXPORT_NAME refused; closing");
                        return Ok(None);
                    }
                };
                let flags = transmission_flags(&*device, structured);
                let mut b = Vec::with_capacity(10 + 124);
                b.extend_from_slice(&device.size_bytes().to_be_bytes());
                b.extend_from_slice(&flags.to_be_bytes());
                if !no_zeroes {
                    b.extend_from_slice(&[0u8; 124]);
                }
                send(wr, &b).await?;
                let base_allocation = selected_context(&meta, &name, structured);
                return Ok(Some(Session {
                    device,
                    export_name: name,
                    structured,
                    base_allocation,
                    transmission_flags: flags,
                }));
            }
            NBD_OPT_ABORT => {
                // Best effort: the client may already have closed.
                let _ = reply(wr, option, NBD_REP_ACK, &[]).await;
                return Ok(None);
            }
            NBD_OPT_LIST => {
                if !data.is_empty() {
                    reply_err(
                        wr,
                        option,
                        NBD_REP_ERR_INVALID,
                        "NBD_OPT_LIST takes no data",
                    )
                    .await?;
                    continue;
                }
                match server.exports.list().await {
                    Ok(list) => {
                        for e in list {
                            let name = truncate_utf8(&e.name, MAX_STRING_BYTES).as_bytes();
                            let mut d = Vec::with_capacity(4 + name.len());
                            d.extend_from_slice(&(name.len() as u32).to_be_bytes());
                            d.extend_from_slice(name);
                            reply(wr, option, NBD_REP_SERVER, &d).await?;
                        }
                        reply(wr, option, NBD_REP_ACK, &[]).await?;
                    }
                    Err(e) => reply_err(wr, option, NBD_REP_ERR_PLATFORM, &e.to_string()).await?,
                }
            }
            NBD_OPT_STARTTLS => {
                reply_err(
                    wr,
                    option,
                    NBD_REP_ERR_UNSUP,
                    "TLS is not supported by this server",
                )
                .await?;
            }
            NBD_OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    reply_err(
                        wr,
                        option,
                        NBD_REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )
                    .await?;
                    continue;
                }
                structured = true;
                reply(wr, option, NBD_REP_ACK, &[]).await?;
            }
            NBD_OPT_INFO | NBD_OPT_GO => {
                let Some(req) = parse_info_request(&data) else {
                    reply_err(wr, option, NBD_REP_ERR_INVALID, "malformed NBD_OPT_INFO/GO").await?;
                    continue;
                };
                let device = match server.exports.open(&req.name).await {
                    Ok(d) => d,
                    Err(e) => {
                        reply_err(wr, option, open_error_reply(&e), &e.to_string()).await?;
                        continue;
                    }
                };
                send_info(server, wr, option, &req, &*device, structured).await?;
                if option == NBD_OPT_GO {
                    let flags = transmission_flags(&*device, structured);
                    let base_allocation = selected_context(&meta, &req.name, structured);
                    return Ok(Some(Session {
                        device,
                        export_name: req.name,
                        structured,
                        base_allocation,
                        transmission_flags: flags,
                    }));
                }
            }
            NBD_OPT_LIST_META_CONTEXT | NBD_OPT_SET_META_CONTEXT => {
                let set = option == NBD_OPT_SET_META_CONTEXT;
                // Both meta-context options require structured replies first (spec).
                if !structured {
                    reply_err(
                        wr,
                        option,
                        NBD_REP_ERR_INVALID,
                        "structured replies not negotiated",
                    )
                    .await?;
                    continue;
                }
                let Some(req) = parse_meta_context_request(&data) else {
                    reply_err(
                        wr,
                        option,
                        NBD_REP_ERR_INVALID,
                        "malformed meta context request",
                    )
                    .await?;
                    continue;
                };
                if let Err(e) = server.exports.open(&req.export).await {
                    reply_err(wr, option, open_error_reply(&e), &e.to_string()).await?;
                    continue;
                }
                let matched = if set {
                    req.queries.iter().any(|q| q == BASE_ALLOCATION)
                } else {
                    req.queries.is_empty()
                        || req
                            .queries
                            .iter()
                            .any(|q| q == BASE_ALLOCATION || q == "base:")
                };
                if matched {
                    // LIST replies carry id 0 (ids are only meaningful after SET).
                    let id = if set { BASE_ALLOCATION_ID } else { 0 };
                    let mut d = Vec::with_capacity(4 + BASE_ALLOCATION.len());
                    d.extend_from_slice(&id.to_be_bytes());
                    d.extend_from_slice(BASE_ALLOCATION.as_bytes());
                    reply(wr, option, NBD_REP_META_CONTEXT, &d).await?;
                }
                if set {
                    meta = Some((req.export, matched));
                }
                reply(wr, option, NBD_REP_ACK, &[]).await?;
            }
            _ => {
                reply_err(wr, option, NBD_REP_ERR_UNSUP, "option not supported").await?;
            }
        }
    }
}

fn selected_context(meta: &Option<(String, bool)>, export: &str, structured: bool) -> Option<u32> {
    match meta {
        Some((name, true)) if structured && name == export => Some(BASE_ALLOCATION_ID),
        _ => None,
    }
}

/// Sends the `NBD_REP_INFO` replies for INFO/GO followed by the final ACK.
async fn send_info<E: Exports, W: AsyncWrite + Unpin>(
    server: &NbdServer<E>,
    wr: &mut W,
    option: u32,
    req: &InfoRequest,
    device: &E::Device,
    structured: bool,
) -> io::Result<()> {
    let mut sent = Vec::new();
    for &item in &req.requests {
        if sent.contains(&item) {
            continue;
        }
        sent.push(item);
        let mut d = Vec::new();
        d.extend_from_slice(&item.to_be_bytes());
        match item {
            NBD_INFO_NAME => {
                d.extend_from_slice(truncate_utf8(&req.name, MAX_STRING_BYTES).as_bytes());
            }
            NBD_INFO_DESCRIPTION => {
                let description = match server.exports.list().await {
                    Ok(list) => list
                        .into_iter()
                        .find(|e| e.name == req.name)
                        .map(|e| e.description),
                    Err(_) => None,
                };
                match description {
                    Some(desc) if !desc.is_empty() => {
                        d.extend_from_slice(truncate_utf8(&desc, MAX_STRING_BYTES).as_bytes())
                    }
                    _ => continue,
                }
            }
            NBD_INFO_BLOCK_SIZE => {
                d.extend_from_slice(&1u32.to_be_bytes());
                d.extend_from_slice(&server.config.preferred_block_bytes.to_be_bytes());
                d.extend_from_slice(&server.config.max_request_bytes.to_be_bytes());
            }
            // NBD_INFO_EXPORT is always sent below; unknown items are ignored (spec).
            _ => continue,
        }
        reply(wr, option, NBD_REP_INFO, &d).await?;
    }
    let mut d = Vec::with_capacity(12);
    d.extend_from_slice(&NBD_INFO_EXPORT.to_be_bytes());
    d.extend_from_slice(&device.size_bytes().to_be_bytes());
    d.extend_from_slice(&transmission_flags(device, structured).to_be_bytes());
    reply(wr, option, NBD_REP_INFO, &d).await?;
    reply(wr, option, NBD_REP_ACK, &[]).await
}
