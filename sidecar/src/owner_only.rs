//! Owner-only files and directories: what slotgate keeps on disk (its state, the audit trail,
//! compiled policies) is created 0700/0600 and opened without following a link, and one that
//! another user owns, or could write or swap, is refused, naming the path and why.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a path slotgate keeps was not used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Another user could read, write or replace it: refused whatever the operator meant.
    #[error("{} is refused: {reason}", path.display())]
    Unsafe { path: PathBuf, reason: String },
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: io::Error },
}

impl FileError {
    fn unsafe_(path: &Path, reason: impl Into<String>) -> FileError {
        FileError::Unsafe {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }

    fn io(path: &Path, error: io::Error) -> FileError {
        FileError::Io {
            path: path.to_owned(),
            error,
        }
    }
}

/// slotgate's effective uid: the owner its files must have.
fn me() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Makes `dir` (0700, with any missing parents) unless it is there, then checks it is slotgate's:
/// a directory, not a link, owned by slotgate's user, writable by no one else, and under
/// directories no other user can swap it out of.
pub fn dir(dir: &Path) -> Result<(), FileError> {
    if std::fs::symlink_metadata(dir).is_err() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| FileError::io(dir, e))?;
    }
    let meta = std::fs::symlink_metadata(dir).map_err(|e| FileError::io(dir, e))?;
    if meta.file_type().is_symlink() {
        return Err(FileError::unsafe_(dir, link_reason(dir)));
    }
    if !meta.is_dir() {
        return Err(FileError::unsafe_(dir, "it is not a directory"));
    }
    check_owner(dir, &meta)?;
    if meta.mode() & 0o022 != 0 {
        return Err(FileError::unsafe_(
            dir,
            format!(
                "it is writable by its group or others (mode {:04o}): another user could replace \
                 what slotgate keeps there; `chmod go-w` it, or give another directory",
                meta.mode() & 0o7777
            ),
        ));
    }
    ancestors(dir)
}

/// Opens the file at `path` with `options`, creating it 0600, never through a link; an existing
/// file must be a regular file of slotgate's user, and is made 0600 if it was readable by others.
pub fn open(path: &Path, options: &mut OpenOptions) -> Result<File, FileError> {
    let file = options
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // O_NOFOLLOW's answer when the last component is a link.
            Some(libc::ELOOP) => FileError::unsafe_(path, link_reason(path)),
            _ => FileError::io(path, e),
        })?;
    let meta = file.metadata().map_err(|e| FileError::io(path, e))?;
    if !meta.is_file() {
        return Err(FileError::unsafe_(path, "it is not a regular file"));
    }
    check_owner(path, &meta)?;
    if meta.mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| FileError::io(path, e))?;
        tracing::info!(file = %path.display(), was = format!("{:04o}", meta.mode() & 0o7777), "made owner-only (0600)");
    }
    Ok(file)
}

fn check_owner(path: &Path, meta: &Metadata) -> Result<(), FileError> {
    match meta.uid() {
        uid if uid == me() => Ok(()),
        uid => Err(FileError::unsafe_(
            path,
            format!(
                "it is owned by {}, not by slotgate's user ({}): that user could read or replace \
                 it; give a path of slotgate's own",
                user(uid),
                user(me())
            ),
        )),
    }
}

/// Every directory above `dir` must be root's or slotgate's user's, and one others may write must
/// be sticky (as /tmp is), so no other user can rename `dir` away and put their own in its place.
/// A link on the way is held to the same rule: its owner could point it elsewhere.
fn ancestors(dir: &Path) -> Result<(), FileError> {
    let full = std::fs::canonicalize(dir).map_err(|e| FileError::io(dir, e))?;
    let given = std::path::absolute(dir).map_err(|e| FileError::io(dir, e))?;
    let links = given
        .ancestors()
        .skip(1)
        .filter_map(|up| Some((up, std::fs::symlink_metadata(up).ok()?)))
        .filter(|(_, meta)| meta.file_type().is_symlink());
    for (up, meta) in links {
        if meta.uid() != 0 && meta.uid() != me() {
            return Err(FileError::unsafe_(
                dir,
                format!(
                    "the link above it, {}, is owned by {}: that user could point it elsewhere",
                    up.display(),
                    user(meta.uid())
                ),
            ));
        }
    }
    for up in full.ancestors().skip(1) {
        let meta = std::fs::metadata(up).map_err(|e| FileError::io(up, e))?;
        let owner_ok = meta.uid() == 0 || meta.uid() == me();
        let sticky = meta.mode() & 0o1000 != 0;
        let others_write = meta.mode() & 0o022 != 0;
        if !owner_ok || (others_write && !sticky) {
            let why = match owner_ok {
                false => format!("is owned by {}", user(meta.uid())),
                true => format!(
                    "is writable by its group or others without the sticky bit (mode {:04o})",
                    meta.mode() & 0o7777
                ),
            };
            return Err(FileError::unsafe_(
                dir,
                format!(
                    "the directory above it, {}, {why}: another user could swap it for their own",
                    up.display()
                ),
            ));
        }
    }
    Ok(())
}

/// What a link refused says: where it points, which slotgate did not touch.
fn link_reason(path: &Path) -> String {
    let target = std::fs::read_link(path)
        .map(|t| t.display().to_string())
        .unwrap_or_else(|_| "?".into());
    format!("it is a symbolic link (to {target}); slotgate does not write through links: give the real path")
}

/// `uid 65534 (nobody)`: the name from /etc/passwd when it has one.
pub fn user(uid: u32) -> String {
    let name = std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                let id = f.nth(1)?;
                (id.parse::<u32>().ok()? == uid).then(|| name.to_owned())
            })
        });
    match name {
        Some(n) => format!("uid {uid} ({n})"),
        None => format!("uid {uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("slotgate-owner-only-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn made_owner_only_and_links_refused() {
        let base = temp("made");
        let d = base.join("a/b");
        dir(&d).unwrap();
        assert_eq!(mode(&d), 0o700);
        let f = d.join("f");
        open(&f, OpenOptions::new().create(true).append(true)).unwrap();
        assert_eq!(mode(&f), 0o600);
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        open(&f, OpenOptions::new().append(true)).unwrap();
        assert_eq!(mode(&f), 0o600, "an existing file is made owner-only");

        let link = d.join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let err = open(&link, OpenOptions::new().append(true)).unwrap_err();
        assert!(matches!(err, FileError::Unsafe { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        let dlink = base.join("dlink");
        std::os::unix::fs::symlink(&d, &dlink).unwrap();
        assert!(matches!(dir(&dlink), Err(FileError::Unsafe { .. })));

        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o770)).unwrap();
        let err = dir(&d).unwrap_err();
        assert!(err.to_string().contains("writable by its group"), "{err}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let open_above = base.join("a");
        std::fs::set_permissions(&open_above, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = dir(&d).unwrap_err();
        assert!(err.to_string().contains("the directory above it"), "{err}");
        std::fs::set_permissions(&open_above, std::fs::Permissions::from_mode(0o1777)).unwrap();
        dir(&d).unwrap();
        let _ = std::fs::remove_dir_all(&base);
    }
}
