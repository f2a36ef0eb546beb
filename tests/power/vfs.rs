//! A crash VFS for SQLite: a disk in memory that keeps the writes made since each file's
//! last sync apart, and at a simulated power cut drops, reorders or tears them, as SQLite's
//! own crash tests do (`test6.c`, the "crash" VFS). It also fails the Nth read, write or
//! sync on demand. See docs/robustness.md, "Power loss and I/O faults".
//!
//! [`install`] registers it as the process's default VFS, so a [`precedent::Store`] opened
//! on a path under a [`Disk`]'s root lives on that disk with no change to the product
//! code. Every other path (a sync hub on a real file, temporary files) goes to SQLite's
//! own "unix" VFS unchanged.
//!
//! The model, per file: `data` (what reads see), `durable` (what survives a cut) and
//! `pending` (the writes and truncations since the last sync, in order). `xSync` makes
//! `data` durable. At a cut each file becomes its durable image plus a random choice of its
//! pending operations, applied in a random order, each whole, dropped, or torn (a prefix of
//! it applied, a multiple of 512 bytes long). A file whose existence was never made durable
//! (never synced itself, and no journal or WAL beside it synced since it was created: that
//! sync also syncs the directory, as the unix VFS does) may vanish. `xDelete` is durable at
//! once. Shared memory (`-shm`) lives in memory with the lock semantics between
//! connections of one process, and is lost at a cut, as after a reboot.
//!
//! After a cut the disk is frozen: every call through a file opened before it fails with
//! `SQLITE_IOERR` (closing and unlocking succeed), so the old connections can be dropped;
//! [`Disk::reboot`] lets new connections in on the post-cut images.

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};

use rusqlite::ffi;

const SECTOR: usize = 512;
const SHM_LOCKS: usize = ffi::SQLITE_SHM_NLOCK as usize;

/// Which calls a [`Fault`] counts and fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    Read,
    Write,
    Sync,
}

/// Fail the `nth` call of `kind` (1 for the first) and, if `persistent`, every one after.
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    pub kind: FaultKind,
    pub nth: u64,
    pub persistent: bool,
}

#[derive(Clone, Debug)]
enum Op {
    Write { at: usize, bytes: Vec<u8> },
    Truncate(usize),
}

impl Op {
    fn apply(&self, image: &mut Vec<u8>, sectors: Option<usize>) {
        match self {
            Op::Write { at, bytes } => {
                let n = sectors.map_or(bytes.len(), |s| (s * SECTOR).min(bytes.len()));
                if image.len() < at + n {
                    image.resize(at + n, 0);
                }
                image[*at..at + n].copy_from_slice(&bytes[..n]);
            }
            Op::Truncate(len) => image.resize(*len, 0),
        }
    }
}

#[derive(Default)]
struct MemFile {
    data: Vec<u8>,
    durable: Vec<u8>,
    /// Whether the file's directory entry survives a cut.
    entry_durable: bool,
    pending: Vec<Op>,
}

/// The locks of one database file between the connections of this process.
#[derive(Default)]
struct FileLock {
    /// Handles holding SHARED or more.
    shared: u32,
    /// The handle holding RESERVED, PENDING or EXCLUSIVE, and which.
    writer: Option<(u64, c_int)>,
}

/// One `-shm`: its regions (never moved while mapped) and its eight locks.
struct Shm {
    state: Mutex<ShmState>,
}

struct ShmState {
    regions: Vec<Box<[u8]>>,
    shared: [u32; SHM_LOCKS],
    exclusive: [Option<u64>; SHM_LOCKS],
}

/// What the disk counts: calls of each kind, cuts made, faults injected.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub reads: u64,
    pub writes: u64,
    pub syncs: u64,
    pub cuts: u64,
    pub faults: u64,
}

struct DiskState {
    files: HashMap<String, MemFile>,
    shm: HashMap<String, Arc<Shm>>,
    locks: HashMap<String, FileLock>,
    /// Bumped at each cut: handles of an older generation are dead.
    generation: u64,
    frozen: bool,
    /// Calls (reads, writes, truncations, syncs) left before a cut.
    countdown: Option<u64>,
    fault: Option<Fault>,
    counts: Counts,
    rng: fastrand::Rng,
    /// A deliberate break, to see the tests fail: syncs make nothing durable.
    lying_sync: bool,
}

/// A disk in memory holding every file under its root.
pub struct Disk {
    root: String,
    state: Mutex<DiskState>,
}

fn disks() -> &'static Mutex<Vec<Arc<Disk>>> {
    static DISKS: OnceLock<Mutex<Vec<Arc<Disk>>>> = OnceLock::new();
    DISKS.get_or_init(|| Mutex::new(Vec::new()))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Disk {
    /// A new, empty disk for the files under `root` (a real directory, so that the store's
    /// own checks of its path pass; nothing is written in it), seeded for its random
    /// choices at cuts.
    pub fn new(root: &Path, seed: u64) -> Arc<Disk> {
        install();
        let root = root.canonicalize().unwrap();
        let disk = Arc::new(Disk {
            root: format!("{}/", root.display()),
            state: Mutex::new(DiskState {
                files: HashMap::new(),
                shm: HashMap::new(),
                locks: HashMap::new(),
                generation: 0,
                frozen: false,
                countdown: None,
                fault: None,
                counts: Counts::default(),
                rng: fastrand::Rng::with_seed(seed),
                lying_sync: false,
            }),
        });
        lock(disks()).push(disk.clone());
        disk
    }

    /// Cuts the power after `calls` more reads, writes, truncations or syncs (the call
    /// that would be the next one fails, and every later one).
    pub fn cut_after(&self, calls: u64) {
        lock(&self.state).countdown = Some(calls);
    }

    /// Cuts the power now.
    pub fn cut_now(&self) {
        let mut s = lock(&self.state);
        s.cut();
    }

    /// Whether a cut happened and no [`Disk::reboot`] since.
    pub fn is_frozen(&self) -> bool {
        lock(&self.state).frozen
    }

    /// Power back: new connections see the post-cut images.
    pub fn reboot(&self) {
        let mut s = lock(&self.state);
        s.frozen = false;
        s.countdown = None;
    }

    /// Fails calls as `fault` says, from now on (counting from now).
    pub fn set_fault(&self, fault: Option<Fault>) {
        let mut s = lock(&self.state);
        s.fault = fault;
        s.counts.reads = 0;
        s.counts.writes = 0;
        s.counts.syncs = 0;
        s.counts.faults = 0;
    }

    /// Makes every sync a no-op (a deliberate break: a disk that ignores fsync).
    pub fn lie_about_sync(&self, lie: bool) {
        lock(&self.state).lying_sync = lie;
    }

    pub fn counts(&self) -> Counts {
        lock(&self.state).counts
    }

    /// Forgets this disk (its files go with it).
    pub fn forget(self: &Arc<Disk>) {
        lock(disks()).retain(|d| !Arc::ptr_eq(d, self));
    }

    fn owning(path: &str) -> Option<Arc<Disk>> {
        lock(disks())
            .iter()
            .find(|d| path.starts_with(&d.root))
            .cloned()
    }
}

impl DiskState {
    /// Counts a call and fails it if the power is off, goes off now, or a fault says so.
    fn tick(&mut self, generation: u64, kind: Option<FaultKind>) -> Result<(), c_int> {
        if self.frozen || generation != self.generation {
            return Err(ffi::SQLITE_IOERR);
        }
        if let Some(n) = self.countdown {
            if n == 0 {
                self.cut();
                return Err(ffi::SQLITE_IOERR);
            }
            self.countdown = Some(n - 1);
        }
        let Some(kind) = kind else { return Ok(()) };
        let seen = match kind {
            FaultKind::Read => &mut self.counts.reads,
            FaultKind::Write => &mut self.counts.writes,
            FaultKind::Sync => &mut self.counts.syncs,
        };
        *seen += 1;
        let seen = *seen;
        if let Some(f) = self.fault
            && f.kind == kind
            && (seen == f.nth || (f.persistent && seen > f.nth))
        {
            self.counts.faults += 1;
            if std::env::var("PRECEDENT_VFS_TRACE").is_ok() {
                eprintln!(
                    "fault {kind:?} #{seen}: {}",
                    std::backtrace::Backtrace::force_capture()
                );
            }
            return Err(match kind {
                FaultKind::Read => ffi::SQLITE_IOERR_READ,
                FaultKind::Write => ffi::SQLITE_IOERR_WRITE,
                FaultKind::Sync => ffi::SQLITE_IOERR_FSYNC,
            });
        }
        Ok(())
    }

    /// The power cut: every file becomes what the disk could hold afterwards.
    fn cut(&mut self) {
        let mut names: Vec<String> = self.files.keys().cloned().collect();
        names.sort();
        for name in names {
            let f = self.files.get_mut(&name).unwrap();
            if !f.entry_durable && self.rng.bool() {
                self.files.remove(&name);
                continue;
            }
            let mut image = f.durable.clone();
            let mut ops: Vec<Op> = std::mem::take(&mut f.pending);
            self.rng.shuffle(&mut ops);
            for op in &ops {
                match self.rng.u8(..4) {
                    0 => {}
                    1 => {
                        let sectors = match op {
                            Op::Write { bytes, .. } => bytes.len().div_ceil(SECTOR),
                            Op::Truncate(_) => 1,
                        };
                        op.apply(&mut image, Some(self.rng.usize(..sectors.max(1))));
                    }
                    _ => op.apply(&mut image, None),
                }
            }
            f.data = image.clone();
            f.durable = image;
            f.entry_durable = true;
        }
        self.shm.clear();
        self.locks.clear();
        self.generation += 1;
        self.frozen = true;
        self.countdown = None;
        self.counts.cuts += 1;
    }
}

// ---- the VFS ----

/// SQLite's own VFS, which does the rest.
struct Vfs {
    unix: *mut ffi::sqlite3_vfs,
}

// SAFETY: the unix VFS is a static of SQLite's, safe to call from any thread.
unsafe impl Send for Vfs {}
unsafe impl Sync for Vfs {}

static VFS_CELL: OnceLock<Vfs> = OnceLock::new();

fn unix() -> *mut ffi::sqlite3_vfs {
    VFS_CELL.get().expect("crash VFS installed").unix
}

/// Registers the crash VFS as the default one (once per process). Call it before any
/// database opens.
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| unsafe {
        let unix = ffi::sqlite3_vfs_find(c"unix".as_ptr());
        assert!(!unix.is_null(), "no unix VFS");
        let size = (*unix)
            .szOsFile
            .max(std::mem::size_of::<MemHandle>() as c_int);
        let me = Box::leak(Box::new(ffi::sqlite3_vfs {
            iVersion: 2,
            szOsFile: size,
            mxPathname: (*unix).mxPathname,
            pNext: std::ptr::null_mut(),
            zName: c"crash".as_ptr(),
            pAppData: std::ptr::null_mut(),
            xOpen: Some(x_open),
            xDelete: Some(x_delete),
            xAccess: Some(x_access),
            xFullPathname: Some(x_full_pathname),
            xDlOpen: (*unix).xDlOpen,
            xDlError: (*unix).xDlError,
            xDlSym: (*unix).xDlSym,
            xDlClose: (*unix).xDlClose,
            xRandomness: Some(x_randomness),
            xSleep: Some(x_sleep),
            xCurrentTime: Some(x_current_time),
            xGetLastError: Some(x_get_last_error),
            xCurrentTimeInt64: Some(x_current_time_int64),
            xSetSystemCall: None,
            xGetSystemCall: None,
            xNextSystemCall: None,
        }));
        let _ = VFS_CELL.set(Vfs { unix });
        let rc = ffi::sqlite3_vfs_register(me, 1);
        assert_eq!(rc, ffi::SQLITE_OK, "registering the crash VFS");
    });
}

/// Our file: the `sqlite3_file` SQLite allocated, with our state behind it.
#[repr(C)]
struct MemHandle {
    base: ffi::sqlite3_file,
    state: *mut Handle,
}

struct Handle {
    disk: Arc<Disk>,
    path: String,
    generation: u64,
    id: u64,
    lock: c_int,
    delete_on_close: bool,
    /// A journal or WAL: its first sync also syncs the directory.
    journal: bool,
    shm: Option<Arc<Shm>>,
    shm_shared: u16,
    shm_exclusive: u16,
}

unsafe fn handle<'a>(f: *mut ffi::sqlite3_file) -> &'a mut Handle {
    unsafe { &mut *(*(f as *mut MemHandle)).state }
}

fn path_of(name: *const c_char) -> Option<String> {
    if name.is_null() {
        return None;
    }
    Some(
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned(),
    )
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(f_close),
    xRead: Some(f_read),
    xWrite: Some(f_write),
    xTruncate: Some(f_truncate),
    xSync: Some(f_sync),
    xFileSize: Some(f_file_size),
    xLock: Some(f_lock),
    xUnlock: Some(f_unlock),
    xCheckReservedLock: Some(f_check_reserved),
    xFileControl: Some(f_file_control),
    xSectorSize: Some(f_sector_size),
    xDeviceCharacteristics: Some(f_device_characteristics),
    xShmMap: Some(f_shm_map),
    xShmLock: Some(f_shm_lock),
    xShmBarrier: Some(f_shm_barrier),
    xShmUnmap: Some(f_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let owner = path_of(name).and_then(|p| Disk::owning(&p).map(|d| (p, d)));
    let Some((path, disk)) = owner else {
        let unix = unix();
        return unsafe { ((*unix).xOpen.unwrap())(unix, name, file, flags, out_flags) };
    };
    let mut s = lock(&disk.state);
    if s.frozen {
        return ffi::SQLITE_IOERR;
    }
    if !s.files.contains_key(&path) {
        if flags & ffi::SQLITE_OPEN_CREATE == 0 {
            return ffi::SQLITE_CANTOPEN;
        }
        s.files.insert(path.clone(), MemFile::default());
    }
    static IDS: AtomicU64 = AtomicU64::new(1);
    let journal = flags & (ffi::SQLITE_OPEN_MAIN_JOURNAL | ffi::SQLITE_OPEN_WAL) != 0;
    let h = Box::new(Handle {
        disk: disk.clone(),
        path,
        generation: s.generation,
        id: IDS.fetch_add(1, Ordering::Relaxed),
        lock: ffi::SQLITE_LOCK_NONE,
        delete_on_close: flags & ffi::SQLITE_OPEN_DELETEONCLOSE != 0,
        journal,
        shm: None,
        shm_shared: 0,
        shm_exclusive: 0,
    });
    drop(s);
    unsafe {
        let m = file as *mut MemHandle;
        (*m).base.pMethods = &IO_METHODS;
        (*m).state = Box::into_raw(h);
        if !out_flags.is_null() {
            *out_flags = flags;
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn x_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    let path = path_of(name).unwrap_or_default();
    let Some(disk) = Disk::owning(&path) else {
        let unix = unix();
        return unsafe { ((*unix).xDelete.unwrap())(unix, name, sync_dir) };
    };
    let mut s = lock(&disk.state);
    if s.frozen {
        return ffi::SQLITE_IOERR_DELETE;
    }
    match s.files.remove(&path) {
        Some(_) => ffi::SQLITE_OK,
        None => ffi::SQLITE_IOERR_DELETE_NOENT,
    }
}

unsafe extern "C" fn x_access(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    let path = path_of(name).unwrap_or_default();
    let Some(disk) = Disk::owning(&path) else {
        let unix = unix();
        return unsafe { ((*unix).xAccess.unwrap())(unix, name, flags, out) };
    };
    let s = lock(&disk.state);
    if s.frozen {
        return ffi::SQLITE_IOERR_ACCESS;
    }
    unsafe { *out = c_int::from(s.files.contains_key(&path)) };
    ffi::SQLITE_OK
}

macro_rules! delegate {
    ($name:ident, $field:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        unsafe extern "C" fn $name(_vfs: *mut ffi::sqlite3_vfs, $($arg: $ty),*) -> $ret {
            let unix = unix();
            unsafe { ((*unix).$field.unwrap())(unix, $($arg),*) }
        }
    };
}

delegate!(x_full_pathname, xFullPathname, (name: *const c_char, n: c_int, out: *mut c_char) -> c_int);
delegate!(x_randomness, xRandomness, (n: c_int, out: *mut c_char) -> c_int);
delegate!(x_sleep, xSleep, (us: c_int) -> c_int);
delegate!(x_current_time, xCurrentTime, (t: *mut f64) -> c_int);
delegate!(x_get_last_error, xGetLastError, (n: c_int, out: *mut c_char) -> c_int);
delegate!(x_current_time_int64, xCurrentTimeInt64, (t: *mut ffi::sqlite3_int64) -> c_int);

// ---- files ----

unsafe extern "C" fn f_close(f: *mut ffi::sqlite3_file) -> c_int {
    let h = unsafe { Box::from_raw((*(f as *mut MemHandle)).state) };
    let mut s = lock(&h.disk.state);
    if h.generation == s.generation {
        release_file_lock(&mut s, &h, ffi::SQLITE_LOCK_NONE);
        if h.delete_on_close && !s.frozen {
            s.files.remove(&h.path);
        }
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    let h = unsafe { handle(f) };
    let mut s = lock(&h.disk.state);
    if let Err(rc) = s.tick(h.generation, Some(FaultKind::Read)) {
        return if rc == ffi::SQLITE_IOERR {
            ffi::SQLITE_IOERR_READ
        } else {
            rc
        };
    }
    let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, amt as usize) };
    let data: &[u8] = s.files.get(&h.path).map_or(&[], |f| &f.data[..]);
    let off = (off as usize).min(data.len());
    let have = (data.len() - off).min(out.len());
    out[..have].copy_from_slice(&data[off..off + have]);
    if have < out.len() {
        out[have..].fill(0);
        return ffi::SQLITE_IOERR_SHORT_READ;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    let h = unsafe { handle(f) };
    let mut s = lock(&h.disk.state);
    if let Err(rc) = s.tick(h.generation, Some(FaultKind::Write)) {
        return if rc == ffi::SQLITE_IOERR {
            ffi::SQLITE_IOERR_WRITE
        } else {
            rc
        };
    }
    let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, amt as usize) }.to_vec();
    let op = Op::Write {
        at: off as usize,
        bytes,
    };
    let file = s.files.entry(h.path.clone()).or_default();
    op.apply(&mut file.data, None);
    file.pending.push(op);
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    let h = unsafe { handle(f) };
    let mut s = lock(&h.disk.state);
    if let Err(rc) = s.tick(h.generation, Some(FaultKind::Write)) {
        return if rc == ffi::SQLITE_IOERR {
            ffi::SQLITE_IOERR_TRUNCATE
        } else {
            rc
        };
    }
    let op = Op::Truncate(size as usize);
    let file = s.files.entry(h.path.clone()).or_default();
    op.apply(&mut file.data, None);
    file.pending.push(op);
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_sync(f: *mut ffi::sqlite3_file, _flags: c_int) -> c_int {
    let h = unsafe { handle(f) };
    let mut s = lock(&h.disk.state);
    if let Err(rc) = s.tick(h.generation, Some(FaultKind::Sync)) {
        return if rc == ffi::SQLITE_IOERR {
            ffi::SQLITE_IOERR_FSYNC
        } else {
            rc
        };
    }
    if s.lying_sync {
        return ffi::SQLITE_OK;
    }
    if h.journal {
        // The unix VFS syncs the directory at a journal's or WAL's first sync: every
        // file created in it so far keeps its name.
        for file in s.files.values_mut() {
            file.entry_durable = true;
        }
    }
    let file = s.files.entry(h.path.clone()).or_default();
    file.durable = file.data.clone();
    file.pending.clear();
    file.entry_durable = true;
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_file_size(
    f: *mut ffi::sqlite3_file,
    size: *mut ffi::sqlite3_int64,
) -> c_int {
    let h = unsafe { handle(f) };
    let s = lock(&h.disk.state);
    if s.frozen || h.generation != s.generation {
        return ffi::SQLITE_IOERR_FSTAT;
    }
    let n = s.files.get(&h.path).map_or(0, |f| f.data.len());
    unsafe { *size = n as ffi::sqlite3_int64 };
    ffi::SQLITE_OK
}

fn release_file_lock(s: &mut DiskState, h: &Handle, to: c_int) {
    let l = s.locks.entry(h.path.clone()).or_default();
    if l.writer.is_some_and(|(id, _)| id == h.id) {
        l.writer = None;
    }
    if to == ffi::SQLITE_LOCK_NONE && h.lock >= ffi::SQLITE_LOCK_SHARED {
        l.shared -= 1;
    }
}

unsafe extern "C" fn f_lock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let h = unsafe { handle(f) };
    let mut s = lock(&h.disk.state);
    if s.frozen || h.generation != s.generation {
        return ffi::SQLITE_IOERR_LOCK;
    }
    if h.lock >= level {
        return ffi::SQLITE_OK;
    }
    let l = s.locks.entry(h.path.clone()).or_default();
    let other_writer = l.writer.filter(|(id, _)| *id != h.id);
    if level == ffi::SQLITE_LOCK_SHARED {
        if other_writer.is_some_and(|(_, lv)| lv >= ffi::SQLITE_LOCK_PENDING) {
            return ffi::SQLITE_BUSY;
        }
        l.shared += 1;
        h.lock = level;
        return ffi::SQLITE_OK;
    }
    if other_writer.is_some() {
        return ffi::SQLITE_BUSY;
    }
    if level == ffi::SQLITE_LOCK_EXCLUSIVE && l.shared > 1 {
        // Wait for the readers: PENDING keeps new ones out meanwhile.
        l.writer = Some((h.id, ffi::SQLITE_LOCK_PENDING));
        h.lock = ffi::SQLITE_LOCK_PENDING;
        return ffi::SQLITE_BUSY;
    }
    l.writer = Some((h.id, level));
    h.lock = level;
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_unlock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    let h = unsafe { handle(f) };
    let mut s = lock(&h.disk.state);
    if h.generation != s.generation {
        h.lock = level.min(h.lock);
        return ffi::SQLITE_OK;
    }
    if h.lock > level {
        release_file_lock(&mut s, h, level);
        h.lock = level;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_check_reserved(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    let h = unsafe { handle(f) };
    let s = lock(&h.disk.state);
    if s.frozen || h.generation != s.generation {
        return ffi::SQLITE_IOERR_CHECKRESERVEDLOCK;
    }
    let held = s.locks.get(&h.path).is_some_and(|l| l.writer.is_some());
    unsafe { *out = c_int::from(held) };
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_file_control(
    _f: *mut ffi::sqlite3_file,
    _op: c_int,
    _arg: *mut c_void,
) -> c_int {
    ffi::SQLITE_NOTFOUND
}

unsafe extern "C" fn f_sector_size(_f: *mut ffi::sqlite3_file) -> c_int {
    SECTOR as c_int
}

/// What the unix VFS reports on Linux: a write changes no byte outside its range (the
/// tears of a cut respect that), and nothing is atomic or sequential.
unsafe extern "C" fn f_device_characteristics(_f: *mut ffi::sqlite3_file) -> c_int {
    ffi::SQLITE_IOCAP_POWERSAFE_OVERWRITE
}

// ---- shared memory ----

unsafe extern "C" fn f_shm_map(
    f: *mut ffi::sqlite3_file,
    region: c_int,
    size: c_int,
    extend: c_int,
    out: *mut *mut c_void,
) -> c_int {
    let h = unsafe { handle(f) };
    let shm = {
        let mut s = lock(&h.disk.state);
        if s.frozen || h.generation != s.generation {
            return ffi::SQLITE_IOERR_SHMMAP;
        }
        match &h.shm {
            Some(shm) => shm.clone(),
            None => {
                let shm = s
                    .shm
                    .entry(h.path.clone())
                    .or_insert_with(|| {
                        Arc::new(Shm {
                            state: Mutex::new(ShmState {
                                regions: Vec::new(),
                                shared: [0; SHM_LOCKS],
                                exclusive: [None; SHM_LOCKS],
                            }),
                        })
                    })
                    .clone();
                h.shm = Some(shm.clone());
                shm
            }
        }
    };
    let mut st = lock(&shm.state);
    let region = region as usize;
    if st.regions.len() <= region {
        if extend == 0 {
            unsafe { *out = std::ptr::null_mut() };
            return ffi::SQLITE_OK;
        }
        while st.regions.len() <= region {
            st.regions.push(vec![0u8; size as usize].into_boxed_slice());
        }
    }
    unsafe { *out = st.regions[region].as_mut_ptr() as *mut c_void };
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_shm_lock(
    f: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    let h = unsafe { handle(f) };
    let unlock = flags & ffi::SQLITE_SHM_UNLOCK != 0;
    let stale = {
        let s = lock(&h.disk.state);
        s.frozen || h.generation != s.generation
    };
    let Some(shm) = h.shm.clone() else {
        return if unlock {
            ffi::SQLITE_OK
        } else {
            ffi::SQLITE_IOERR_SHMLOCK
        };
    };
    if stale && !unlock {
        return ffi::SQLITE_IOERR_SHMLOCK;
    }
    let mut st = lock(&shm.state);
    let range = offset as usize..(offset + n) as usize;
    let mask: u16 = range.clone().fold(0, |m, i| m | (1 << i));
    let exclusive = flags & ffi::SQLITE_SHM_EXCLUSIVE != 0;
    if unlock {
        for i in range {
            let bit = 1u16 << i;
            if h.shm_shared & bit != 0 {
                st.shared[i] -= 1;
            }
            if h.shm_exclusive & bit != 0 {
                st.exclusive[i] = None;
            }
        }
        h.shm_shared &= !mask;
        h.shm_exclusive &= !mask;
        return ffi::SQLITE_OK;
    }
    for i in range.clone() {
        let bit = 1u16 << i;
        let others_shared = st.shared[i] - u32::from(h.shm_shared & bit != 0);
        let other_excl = st.exclusive[i].is_some_and(|id| id != h.id);
        if other_excl || (exclusive && others_shared > 0) {
            return ffi::SQLITE_BUSY;
        }
    }
    for i in range {
        let bit = 1u16 << i;
        if exclusive {
            st.exclusive[i] = Some(h.id);
        } else if h.shm_shared & bit == 0 {
            st.shared[i] += 1;
        }
    }
    if exclusive {
        h.shm_exclusive |= mask;
    } else {
        h.shm_shared |= mask;
    }
    ffi::SQLITE_OK
}

unsafe extern "C" fn f_shm_barrier(_f: *mut ffi::sqlite3_file) {
    std::sync::atomic::fence(Ordering::SeqCst);
}

unsafe extern "C" fn f_shm_unmap(f: *mut ffi::sqlite3_file, _delete: c_int) -> c_int {
    let h = unsafe { handle(f) };
    let Some(shm) = h.shm.take() else {
        return ffi::SQLITE_OK;
    };
    {
        let mut st = lock(&shm.state);
        for i in 0..SHM_LOCKS {
            let bit = 1u16 << i;
            if h.shm_shared & bit != 0 {
                st.shared[i] -= 1;
            }
            if h.shm_exclusive & bit != 0 {
                st.exclusive[i] = None;
            }
        }
    }
    h.shm_shared = 0;
    h.shm_exclusive = 0;
    let mut s = lock(&h.disk.state);
    // The last connection gone: the next one starts on fresh memory and rebuilds the
    // index from the WAL, as SQLite does with a -shm no connection holds.
    if let Some(mine) = s.shm.get(&h.path)
        && Arc::ptr_eq(mine, &shm)
        && Arc::strong_count(&shm) == 2
    {
        s.shm.remove(&h.path);
    }
    ffi::SQLITE_OK
}
