//! docket-forgetfs: a FUSE file system over a backing folder that keeps every write in memory
//! until the file is synced, and forgets what was never synced when it is unmounted — a host
//! losing its power, as the tests of docket's durability need one.
//!
//! ```text
//! docket-forgetfs BACKING MOUNTPOINT [--keep FRACTION] [--seed N]
//! ```
//!
//! - Reads see the file as written (the backing file's bytes with the unsynced writes over them).
//! - A write, a truncation or an `fallocate` that grows a file changes only its copy in memory.
//!   `fsync`/`fdatasync` (an `msync` of a mapping reaches here as one, after the kernel wrote the
//!   mapping's dirty pages) writes the file's unsynced pages and size to the backing file and syncs
//!   it. Closing a file syncs nothing, as POSIX promises nothing at close.
//! - Names (create, mkdir, symlink, rename, unlink, rmdir) go to the backing folder at once, and
//!   each is noted with the folders it changed; it is durable once each of them was synced
//!   (`fsync` of the folder: POSIX asks no less, and a file's own `fsync` is not enough). An
//!   unlinked file, or one a rename replaced, waits in `BACKING.trash` until then.
//! - When it is unmounted (`fusermount3 -u`, after the processes using it were killed) the pages
//!   never synced are dropped — or, with `--keep F`, each is written with probability F (seeded by
//!   `--seed`): a disk may have written back any subset of them before the power went. Then the
//!   name operations not durable are undone, newest first (a file made is removed, a rename moved
//!   back, an unlinked file put back) — with `--keep F`, but for a random first part of them, as a
//!   journal commits in order. The process prints one line of figures to stderr and exits.
//!   Mounting it again over the same backing folder is the host coming back.
//!
//! Inodes are the backing files' inode numbers (the root is 1); the kernel's attribute and entry
//! caches are off (a time to live of 0), so a size changed here is seen at once.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    TimeOrNow, WriteFlags,
};

const PAGE: u64 = 4096;
const TTL: Duration = Duration::ZERO;

/// What a file holds beyond what its backing file holds: written pages and its size.
struct Unsynced {
    size: u64,
    /// Bytes of the backing file still the file's below this (a truncation lowers it: a page
    /// loaded later must not bring back bytes cut off).
    durable_until: u64,
    pages: BTreeMap<u64, Vec<u8>>,
}

/// How a name operation not yet durable is undone at a cut (paths relative to the backing folder).
enum Undo {
    /// A name made (create, mkdir, symlink): removed, with what lies under it.
    Remove(PathBuf),
    /// A rename: moved back, and the entry it replaced (kept in the trash) put back.
    MoveBack { from: PathBuf, to: PathBuf, replaced: Option<PathBuf> },
    /// An unlink: the file, kept in the trash, put back under its name.
    Restore { rel: PathBuf, kept: PathBuf },
    /// An rmdir: the (empty) folder made again.
    Remake(PathBuf),
}

/// A name operation and the folders whose sync it still waits for.
struct NameOp {
    waits: Vec<PathBuf>,
    undo: Undo,
}

#[derive(Default)]
struct Figures {
    writes: u64,
    syncs: u64,
    pages_synced: u64,
    pages_dropped: u64,
    pages_kept: u64,
    names_undone: u64,
    names_kept: u64,
}

struct State {
    paths: HashMap<u64, PathBuf>,
    files: HashMap<u64, (File, u32)>,
    unsynced: HashMap<u64, Unsynced>,
    names: Vec<NameOp>,
    trashed: u64,
    rng: u64,
    figures: Figures,
}

struct ForgetFs {
    backing: PathBuf,
    trash: PathBuf,
    root_ino: u64,
    keep: f64,
    state: Mutex<State>,
}

fn parent_of(rel: &Path) -> PathBuf {
    rel.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn remove_any(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// What a durable operation kept in the trash is gone for good.
fn forget_kept(undo: &Undo) {
    if let Undo::Restore { kept, .. } | Undo::MoveBack { replaced: Some(kept), .. } = undo {
        let _ = remove_any(kept);
    }
}

fn errno(e: io::Error) -> Errno {
    Errno::from(e)
}

fn kind_of(meta: &fs::Metadata) -> FileType {
    let t = meta.file_type();
    if t.is_dir() {
        FileType::Directory
    } else if t.is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    }
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

impl ForgetFs {
    fn full(&self, rel: &Path) -> PathBuf {
        self.backing.join(rel)
    }

    fn ino_of(&self, meta: &fs::Metadata) -> u64 {
        if meta.ino() == self.root_ino { 1 } else { meta.ino() }
    }

    fn attr(&self, st: &State, ino: u64, meta: &fs::Metadata) -> FileAttr {
        let size = st.unsynced.get(&ino).map_or(meta.len(), |u| u.size);
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: time(meta.atime(), meta.atime_nsec()),
            mtime: time(meta.mtime(), meta.mtime_nsec()),
            ctime: time(meta.ctime(), meta.ctime_nsec()),
            crtime: UNIX_EPOCH,
            kind: kind_of(meta),
            perm: (meta.mode() & 0o7777) as u16,
            nlink: meta.nlink() as u32,
            uid: meta.uid(),
            gid: meta.gid(),
            rdev: meta.rdev() as u32,
            blksize: PAGE as u32,
            flags: 0,
        }
    }

    fn path(st: &State, ino: u64) -> Result<PathBuf, Errno> {
        st.paths.get(&ino).cloned().ok_or(Errno::ENOENT)
    }

    /// The entry `name` of folder `parent`, known from now on by its inode.
    fn entry(&self, st: &mut State, parent: u64, name: &OsStr) -> Result<FileAttr, Errno> {
        let rel = Self::path(st, parent)?.join(name);
        let meta = fs::symlink_metadata(self.full(&rel)).map_err(errno)?;
        let ino = self.ino_of(&meta);
        st.paths.insert(ino, rel);
        Ok(self.attr(st, ino, &meta))
    }

    fn getattr_of(&self, st: &State, ino: u64) -> Result<FileAttr, Errno> {
        let rel = Self::path(st, ino)?;
        let meta = match st.files.get(&ino) {
            Some((f, _)) => f.metadata(),                 // also when its name is gone
            None => fs::symlink_metadata(self.full(&rel)),
        }
        .map_err(errno)?;
        Ok(self.attr(st, ino, &meta))
    }

    /// The backing file of `ino`, opened for this call when no open handle holds it.
    fn with_file<T>(&self, st: &State, ino: u64, f: impl FnOnce(&File) -> io::Result<T>)
                    -> Result<T, Errno> {
        if let Some((file, _)) = st.files.get(&ino) {
            return f(file).map_err(errno);
        }
        let rel = Self::path(st, ino)?;
        let file = OpenOptions::new().read(true).write(true).open(self.full(&rel)).map_err(errno)?;
        f(&file).map_err(errno)
    }

    fn unsynced<'a>(&self, st: &'a mut State, ino: u64) -> Result<&'a mut Unsynced, Errno> {
        if !st.unsynced.contains_key(&ino) {
            let size = self.with_file(st, ino, |f| Ok(f.metadata()?.len()))?;
            st.unsynced.insert(ino, Unsynced { size, durable_until: size, pages: BTreeMap::new() });
        }
        Ok(st.unsynced.get_mut(&ino).expect("inserted above"))
    }

    /// Page `index` of `ino` as the file holds it now (loaded from the backing file).
    fn load_page(&self, st: &State, ino: u64, index: u64, durable_until: u64)
                 -> Result<Vec<u8>, Errno> {
        let mut page = vec![0u8; PAGE as usize];
        let start = index * PAGE;
        if start < durable_until {
            let n = (durable_until - start).min(PAGE) as usize;
            self.with_file(st, ino, |f| read_at_most(f, &mut page[..n], start))?;
        }
        Ok(page)
    }

    /// Write `ino`'s unsynced pages and size to its backing file and sync it.
    fn sync(&self, st: &mut State, ino: u64) -> Result<(), Errno> {
        let Some(u) = st.unsynced.remove(&ino) else {
            return self.with_file(st, ino, |f| f.sync_all());
        };
        let pages = u.pages.len() as u64;
        let result = self.with_file(st, ino, |f| {
            f.set_len(u.size)?;
            for (index, page) in &u.pages {
                let start = index * PAGE;
                if start < u.size {
                    let n = (u.size - start).min(PAGE) as usize;
                    f.write_all_at(&page[..n], start)?;
                }
            }
            f.sync_all()
        });
        st.figures.syncs += 1;
        st.figures.pages_synced += pages;
        result
    }

    /// `full` moved to the trash, where it waits until its removal is durable.
    fn to_trash(&self, st: &mut State, full: &Path) -> io::Result<PathBuf> {
        st.trashed += 1;
        let kept = self.trash.join(st.trashed.to_string());
        fs::rename(full, &kept)?;
        Ok(kept)
    }

    /// A name operation on the folders `waits`, undone at a cut unless each is synced first.
    fn note(st: &mut State, mut waits: Vec<PathBuf>, undo: Undo) {
        waits.dedup();
        st.names.push(NameOp { waits, undo });
    }

    /// Folder `dir` was synced: the operations that waited for it alone are durable.
    fn names_synced(st: &mut State, dir: &Path) {
        for op in &mut st.names {
            op.waits.retain(|d| d != dir);
        }
        let (durable, pending): (Vec<NameOp>, Vec<NameOp>) =
            st.names.drain(..).partition(|op| op.waits.is_empty());
        st.names = pending;
        for op in &durable {
            forget_kept(&op.undo);
        }
    }

    /// Undo `undo` in the backing folder (what a later operation left in the way is overwritten
    /// or left: a cut's undoing does its best, as a disk's recovery does).
    fn undo(&self, undo: &Undo) {
        let _ = match undo {
            Undo::Remove(rel) => remove_any(&self.full(rel)),
            Undo::MoveBack { from, to, replaced } => {
                let back = fs::rename(self.full(to), self.full(from));
                if let Some(kept) = replaced {
                    let _ = fs::rename(kept, self.full(to));
                }
                back
            }
            Undo::Restore { rel, kept } => fs::rename(kept, self.full(rel)),
            Undo::Remake(rel) => fs::create_dir(self.full(rel)),
        };
    }

    fn next_random(st: &mut State) -> f64 {
        // xorshift64*: reproducible from the seed, nothing more is asked of it
        st.rng ^= st.rng >> 12;
        st.rng ^= st.rng << 25;
        st.rng ^= st.rng >> 27;
        (st.rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn read_at_most(f: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let n = f.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}

impl Filesystem for ForgetFs {
    fn destroy(&mut self) {
        let mut st = self.state.lock().expect("the state's lock");
        let all: Vec<(u64, Unsynced)> = st.unsynced.drain().collect();
        for (ino, u) in all {
            for (index, page) in &u.pages {
                let start = index * PAGE;
                if start < u.size && self.keep > 0.0 && Self::next_random(&mut st) < self.keep {
                    let n = (u.size - start).min(PAGE) as usize;    // never past the file's end
                    let _ = self.with_file(&st, ino, |f| f.write_all_at(&page[..n], start));
                    st.figures.pages_kept += 1;
                } else {
                    st.figures.pages_dropped += 1;
                }
            }
        }
        let pending = std::mem::take(&mut st.names);
        let kept = if self.keep > 0.0 {
            ((Self::next_random(&mut st) * (pending.len() + 1) as f64) as usize).min(pending.len())
        } else {
            0
        };
        for op in pending[..kept].iter() {
            forget_kept(&op.undo);
        }
        for op in pending[kept..].iter().rev() {
            self.undo(&op.undo);
        }
        st.figures.names_kept += kept as u64;
        st.figures.names_undone += (pending.len() - kept) as u64;
        let f = &st.figures;
        eprintln!("forgetfs: unmounted: {} writes, {} syncs, {} pages synced, {} unsynced pages \
                   dropped, {} kept, {} name operations undone, {} kept", f.writes, f.syncs,
                  f.pages_synced, f.pages_dropped, f.pages_kept, f.names_undone, f.names_kept);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut st = self.state.lock().expect("the state's lock");
        match self.entry(&mut st, parent.0, name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = self.state.lock().expect("the state's lock");
        match self.getattr_of(&st, ino.0) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(&self, _req: &Request, ino: INodeNo, mode: Option<u32>, _uid: Option<u32>,
               _gid: Option<u32>, size: Option<u64>, _atime: Option<TimeOrNow>,
               _mtime: Option<TimeOrNow>, _ctime: Option<SystemTime>, _fh: Option<FileHandle>,
               _crtime: Option<SystemTime>, _chgtime: Option<SystemTime>,
               _bkuptime: Option<SystemTime>, _flags: Option<fuser::BsdFileFlags>,
               reply: ReplyAttr) {
        let mut st = self.state.lock().expect("the state's lock");
        let ino = ino.0;
        let result = (|| {
            if let Some(mode) = mode {
                let rel = Self::path(&st, ino)?;
                fs::set_permissions(self.full(&rel), fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(errno)?;
            }
            if let Some(size) = size {
                let u = self.unsynced(&mut st, ino)?;
                u.size = size;
                u.durable_until = u.durable_until.min(size);
                let first_gone = size.div_ceil(PAGE);
                u.pages.retain(|&index, _| index < first_gone);
                if size % PAGE != 0 {
                    if let Some(page) = u.pages.get_mut(&(size / PAGE)) {
                        page[(size % PAGE) as usize..].fill(0);
                    }
                }
            }
            self.getattr_of(&st, ino)
        })();
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let st = self.state.lock().expect("the state's lock");
        match Self::path(&st, ino.0).and_then(|rel| fs::read_link(self.full(&rel)).map_err(errno)) {
            Ok(target) => reply.data(target.as_os_str().as_bytes()),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32,
             reply: ReplyEntry) {
        let mut st = self.state.lock().expect("the state's lock");
        let result = Self::path(&st, parent.0).and_then(|rel| {
            let full = self.full(&rel.join(name));
            fs::create_dir(&full).map_err(errno)?;
            Self::note(&mut st, vec![rel.clone()], Undo::Remove(rel.join(name)));
            fs::set_permissions(&full, fs::Permissions::from_mode(mode & !umask & 0o7777))
                .map_err(errno)?;
            self.entry(&mut st, parent.0, name)
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.state.lock().expect("the state's lock");
        let result = Self::path(&st, parent.0).and_then(|rel| {
            let full = self.full(&rel.join(name));
            let meta = fs::symlink_metadata(&full).map_err(errno)?;
            if meta.is_dir() {
                return Err(Errno::EISDIR);
            }
            let kept = self.to_trash(&mut st, &full).map_err(errno)?;
            Self::note(&mut st, vec![rel.clone()], Undo::Restore { rel: rel.join(name), kept });
            let ino = self.ino_of(&meta);
            if !st.files.contains_key(&ino) && meta.nlink() <= 1 {
                st.unsynced.remove(&ino);            // gone with its name and no handle
                st.paths.remove(&ino);
            }
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = self.state.lock().expect("the state's lock");
        let result = Self::path(&st, parent.0).and_then(|rel| {
            fs::remove_dir(self.full(&rel.join(name))).map_err(errno)?;
            Self::note(&mut st, vec![rel.clone()], Undo::Remake(rel.join(name)));
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn symlink(&self, _req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path,
               reply: ReplyEntry) {
        let mut st = self.state.lock().expect("the state's lock");
        let result = Self::path(&st, parent.0).and_then(|rel| {
            std::os::unix::fs::symlink(target, self.full(&rel.join(link_name))).map_err(errno)?;
            Self::note(&mut st, vec![rel.clone()], Undo::Remove(rel.join(link_name)));
            self.entry(&mut st, parent.0, link_name)
        });
        match result {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(&self, _req: &Request, parent: INodeNo, name: &OsStr, newparent: INodeNo,
              newname: &OsStr, flags: RenameFlags, reply: ReplyEmpty) {
        let mut st = self.state.lock().expect("the state's lock");
        let result = (|| {
            if !flags.is_empty() {
                return Err(Errno::EINVAL);
            }
            let from = Self::path(&st, parent.0)?.join(name);
            let to = Self::path(&st, newparent.0)?.join(newname);
            let replaced = fs::symlink_metadata(self.full(&to)).ok();
            fs::symlink_metadata(self.full(&from)).map_err(errno)?;
            let kept = match &replaced {
                Some(_) => Some(self.to_trash(&mut st, &self.full(&to)).map_err(errno)?),
                None => None,
            };
            if let Err(e) = fs::rename(self.full(&from), self.full(&to)) {
                if let Some(kept) = &kept {
                    let _ = fs::rename(kept, self.full(&to));
                }
                return Err(errno(e));
            }
            Self::note(&mut st, vec![parent_of(&from), parent_of(&to)],
                       Undo::MoveBack { from: from.clone(), to: to.clone(), replaced: kept });
            if let Some(meta) = replaced {
                let ino = self.ino_of(&meta);
                if !st.files.contains_key(&ino) && meta.nlink() <= 1 && !meta.is_dir() {
                    st.unsynced.remove(&ino);
                }
            }
            for rel in st.paths.values_mut() {      // the entry, and what lies under it
                if let Ok(rest) = rel.strip_prefix(&from) {
                    *rel = if rest.as_os_str().is_empty() { to.clone() } else { to.join(rest) };
                }
            }
            Ok(())
        })();
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut st = self.state.lock().expect("the state's lock");
        let ino = ino.0;
        if let Some((_, opens)) = st.files.get_mut(&ino) {
            *opens += 1;
            return reply.opened(FileHandle(ino), FopenFlags::empty());
        }
        let result = Self::path(&st, ino).and_then(|rel| {
            let full = self.full(&rel);
            OpenOptions::new().read(true).write(true).open(&full)
                .or_else(|_| File::open(&full)).map_err(errno)
        });
        match result {
            Ok(file) => {
                st.files.insert(ino, (file, 1));
                reply.opened(FileHandle(ino), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }

    fn create(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32,
              _flags: i32, reply: ReplyCreate) {
        let mut st = self.state.lock().expect("the state's lock");
        let result = Self::path(&st, parent.0).and_then(|rel| {
            let existed = fs::symlink_metadata(self.full(&rel.join(name))).is_ok();
            let file = OpenOptions::new().read(true).write(true).create(true)
                .mode(mode & !umask & 0o7777).open(self.full(&rel.join(name))).map_err(errno)?;
            if !existed {
                Self::note(&mut st, vec![rel.clone()], Undo::Remove(rel.join(name)));
            }
            let attr = self.entry(&mut st, parent.0, name)?;
            let ino = attr.ino.0;
            match st.files.get_mut(&ino) {
                Some((_, opens)) => *opens += 1,
                None => {
                    st.files.insert(ino, (file, 1));
                }
            }
            Ok(attr)
        });
        match result {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(attr.ino.0),
                                      FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, size: u32,
            _flags: OpenFlags, _lock_owner: Option<LockOwner>, reply: ReplyData) {
        let st = self.state.lock().expect("the state's lock");
        let ino = ino.0;
        let result = (|| {
            let Some(u) = st.unsynced.get(&ino) else {
                let mut buf = vec![0u8; size as usize];
                let n = self.with_file(&st, ino, |f| read_at_most(f, &mut buf, offset))?;
                buf.truncate(n);
                return Ok(buf);
            };
            if offset >= u.size {
                return Ok(Vec::new());
            }
            let end = u.size.min(offset + size as u64);
            let mut buf = vec![0u8; (end - offset) as usize];
            if offset < u.durable_until {
                let n = (u.durable_until.min(end) - offset) as usize;
                self.with_file(&st, ino, |f| read_at_most(f, &mut buf[..n], offset))?;
            }
            for (index, page) in u.pages.range(offset / PAGE..end.div_ceil(PAGE)) {
                let start = index * PAGE;
                let a = start.max(offset);
                let b = (start + PAGE).min(end);
                buf[(a - offset) as usize..(b - offset) as usize]
                    .copy_from_slice(&page[(a - start) as usize..(b - start) as usize]);
            }
            Ok(buf)
        })();
        match result {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        }
    }

    fn write(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, data: &[u8],
             _write_flags: WriteFlags, _flags: OpenFlags, _lock_owner: Option<LockOwner>,
             reply: ReplyWrite) {
        let mut st = self.state.lock().expect("the state's lock");
        let ino = ino.0;
        let result = (|| {
            let durable_until = self.unsynced(&mut st, ino)?.durable_until;
            let end = offset + data.len() as u64;
            let mut index = offset / PAGE;
            while index * PAGE < end {
                if !st.unsynced[&ino].pages.contains_key(&index) {
                    let page = self.load_page(&st, ino, index, durable_until)?;
                    st.unsynced.get_mut(&ino).expect("made above").pages.insert(index, page);
                }
                let start = index * PAGE;
                let a = start.max(offset);
                let b = (start + PAGE).min(end);
                let u = st.unsynced.get_mut(&ino).expect("made above");
                u.pages.get_mut(&index).expect("inserted above")
                    [(a - start) as usize..(b - start) as usize]
                    .copy_from_slice(&data[(a - offset) as usize..(b - offset) as usize]);
                index += 1;
            }
            let u = st.unsynced.get_mut(&ino).expect("made above");
            u.size = u.size.max(end);
            st.figures.writes += 1;
            Ok(data.len() as u32)
        })();
        match result {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner,
             reply: ReplyEmpty) {
        reply.ok();                                  // a close promises nothing
    }

    fn release(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _flags: OpenFlags,
               _lock_owner: Option<LockOwner>, _flush: bool, reply: ReplyEmpty) {
        let mut st = self.state.lock().expect("the state's lock");
        let ino = ino.0;
        if let Some((_, opens)) = st.files.get_mut(&ino) {
            *opens -= 1;
            if *opens == 0 {
                st.files.remove(&ino);
                let rel = st.paths.get(&ino).cloned();
                let gone = rel.is_none_or(|rel| {
                    fs::symlink_metadata(self.full(&rel)).map_or(true, |m| self.ino_of(&m) != ino)
                });
                if gone {
                    st.unsynced.remove(&ino);        // deleted while open: nothing can sync it
                }
            }
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool,
             reply: ReplyEmpty) {
        let mut st = self.state.lock().expect("the state's lock");
        match self.sync(&mut st, ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64,
               mut reply: ReplyDirectory) {
        let st = self.state.lock().expect("the state's lock");
        let result = Self::path(&st, ino.0).and_then(|rel| {
            let mut entries = vec![(ino.0, FileType::Directory, OsStr::new(".").to_owned()),
                                   (1, FileType::Directory, OsStr::new("..").to_owned())];
            for e in fs::read_dir(self.full(&rel)).map_err(errno)? {
                let e = e.map_err(errno)?;
                let meta = e.metadata().map_err(errno)?;
                entries.push((self.ino_of(&meta), kind_of(&meta), e.file_name()));
            }
            Ok(entries)
        });
        match result {
            Ok(entries) => {
                for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
                    if reply.add(INodeNo(*ino), (i + 1) as u64, *kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool,
                reply: ReplyEmpty) {
        let mut st = self.state.lock().expect("the state's lock");
        let result = Self::path(&st, ino.0).and_then(|rel| {
            File::open(self.full(&rel)).and_then(|d| d.sync_all()).map_err(errno)?;
            Self::names_synced(&mut st, &rel);
            Ok(())
        });
        match result {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let path = CString::new(self.backing.as_os_str().as_bytes()).expect("a path without NUL");
        // SAFETY: a valid NUL-terminated path and a zeroed struct for the call to fill.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(io::Error::last_os_error()));
        }
        reply.statfs(s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree, s.f_bsize as u32,
                     s.f_namemax as u32, s.f_frsize as u32);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags,
              reply: ReplyEmpty) {
        reply.ok();
    }

    fn fallocate(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, length: u64,
                 mode: i32, reply: ReplyEmpty) {
        if mode != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        let mut st = self.state.lock().expect("the state's lock");
        match self.unsynced(&mut st, ino.0) {
            Ok(u) => {
                u.size = u.size.max(offset + length);   // a size, not yet durable either
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }
}

fn usage() -> ! {
    eprintln!("usage: docket-forgetfs BACKING MOUNTPOINT [--keep FRACTION] [--seed N]");
    std::process::exit(64);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 2 {
        usage();
    }
    let (mut keep, mut seed) = (0.0f64, 1u64);
    let mut rest = args[2..].iter();
    while let Some(flag) = rest.next() {
        let value = rest.next().unwrap_or_else(|| usage());
        match flag.as_str() {
            "--keep" => keep = value.parse().unwrap_or_else(|_| usage()),
            "--seed" => seed = value.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let backing = fs::canonicalize(&args[0]).unwrap_or_else(|e| {
        eprintln!("docket-forgetfs: backing folder {}: {e}", args[0]);
        std::process::exit(66);
    });
    let root_ino = fs::metadata(&backing).map(|m| m.ino()).unwrap_or(0);
    let mut trash = backing.clone().into_os_string();
    trash.push(".trash");
    let trash = PathBuf::from(trash);
    let _ = fs::remove_dir_all(&trash);                  // a former mount's, all durable
    if let Err(e) = fs::create_dir_all(&trash) {
        eprintln!("docket-forgetfs: trash folder {}: {e}", trash.display());
        std::process::exit(73);
    }
    let fs = ForgetFs {
        backing,
        trash,
        root_ino,
        keep,
        state: Mutex::new(State {
            paths: HashMap::from([(1, PathBuf::new())]),
            files: HashMap::new(),
            unsynced: HashMap::new(),
            names: Vec::new(),
            trashed: 0,
            rng: seed.max(1),
            figures: Figures::default(),
        }),
    };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("docket-forgetfs".into()),
                                MountOption::Subtype("forgetfs".into())];
    if let Err(e) = fuser::mount(fs, &args[1], &config) {
        eprintln!("docket-forgetfs: mount on {}: {e}", args[1]);
        std::process::exit(1);
    }
}
