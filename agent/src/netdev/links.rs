//! Every link of the calling thread's network namespace with its bridge
//! master, from one rtnetlink dump (`RTM_GETLINK`). /sys would show the
//! namespace that mounted it, and `if_nameindex` does not say which bridge
//! a device is a port of.

use std::{io, mem::size_of};

/// A link: its name, index and the index of its master (the bridge it is a
/// port of), if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub name: String,
    pub index: u32,
    pub master: Option<u32>,
}

const NLMSG_HDR: usize = 16;
const IFINFO: usize = 16;
const RTA_HDR: usize = 4;
const IFLA_IFNAME: u16 = 3;
const IFLA_MASTER: u16 = 10;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// An open `NETLINK_ROUTE` socket, closed on drop.
struct Socket(i32);

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// Every link, sorted by index.
pub fn links() -> io::Result<Vec<Link>> {
    // SAFETY: plain socket(2) call; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let sock = Socket(fd);
    // nlmsghdr + ifinfomsg (family AF_UNSPEC: every link).
    let mut req = [0u8; NLMSG_HDR + IFINFO];
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    req[6..8].copy_from_slice(&flags.to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // SAFETY: sending a buffer we own, of its own length.
    let sent = unsafe { libc::send(sock.0, req.as_ptr().cast(), req.len(), 0) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: receiving into a buffer we own, at most its length.
        let n = unsafe { libc::recv(sock.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n == 0 {
            break;
        }
        if parse(&buf[..n], &mut out)? {
            break;
        }
    }
    out.sort_by_key(|l| l.index);
    Ok(out)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn truncated() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "truncated netlink message")
}

/// Parses one datagram of the dump into `out`; true once it is done.
fn parse(mut b: &[u8], out: &mut Vec<Link>) -> io::Result<bool> {
    while b.len() >= NLMSG_HDR {
        let len = u32_at(b, 0).ok_or_else(truncated)? as usize;
        let kind = u16_at(b, 4).ok_or_else(truncated)?;
        if len < NLMSG_HDR || len > b.len() {
            return Err(truncated());
        }
        let msg = &b[NLMSG_HDR..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = u32_at(msg, 0).ok_or_else(truncated)? as i32;
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
            }
            RTM_NEWLINK => {
                if let Some(link) = link(msg) {
                    out.push(link);
                }
            }
            _ => {}
        }
        b = b.get(align4(len)..).unwrap_or_default();
    }
    Ok(false)
}

/// One `RTM_NEWLINK` payload: ifinfomsg, then attributes.
fn link(msg: &[u8]) -> Option<Link> {
    let index = u32_at(msg, 4)?;
    let mut name = None;
    let mut master = None;
    let mut attrs = msg.get(IFINFO..)?;
    while attrs.len() >= RTA_HDR {
        let len = usize::from(u16_at(attrs, 0)?);
        let kind = u16_at(attrs, 2)?;
        if len < RTA_HDR || len > attrs.len() {
            break;
        }
        let data = &attrs[RTA_HDR..len];
        match kind {
            IFLA_IFNAME => {
                let end = data.iter().position(|c| *c == 0).unwrap_or(data.len());
                name = Some(String::from_utf8_lossy(&data[..end]).into_owned());
            }
            IFLA_MASTER => master = u32_at(data, 0).filter(|m| *m != 0),
            _ => {}
        }
        attrs = attrs.get(align4(len)..).unwrap_or_default();
    }
    Some(Link {
        name: name?,
        index,
        master,
    })
}

const _: () = assert!(size_of::<libc::nlmsghdr>() == NLMSG_HDR);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_without_a_master() {
        let links = links().unwrap();
        let lo = links.iter().find(|l| l.name == "lo").unwrap();
        assert_eq!((lo.index, lo.master), (1, None));
    }

    #[test]
    fn a_truncated_dump_is_an_error_not_a_panic() {
        let mut out = Vec::new();
        let mut msg = vec![0u8; 20];
        msg[0..4].copy_from_slice(&200u32.to_ne_bytes());
        assert!(parse(&msg, &mut out).is_err());
        // A link message whose attribute runs past the end is cut there.
        let mut m = vec![0u8; IFINFO + 8];
        m[4..8].copy_from_slice(&7u32.to_ne_bytes());
        m[IFINFO..IFINFO + 2].copy_from_slice(&100u16.to_ne_bytes());
        assert_eq!(link(&m), None);
    }
}
