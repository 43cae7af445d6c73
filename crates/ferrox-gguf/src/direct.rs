//! Reading tensor data past the page cache (`O_DIRECT`), for loads that copy the weights
//! elsewhere anyway (repacking, the streamed experts' cache): the copy is all that stays in
//! memory, and large files are read at the device's speed rather than page by page.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// `O_DIRECT` wants the file offset, the length and the buffer aligned to the device's
/// logical block; 4 KiB covers every common one.
const ALIGN: u64 = 4096;

/// A file opened for direct reads.
pub(crate) struct DirectFile(File);

impl DirectFile {
    /// Opens `path` with `O_DIRECT`; an error where the system or filesystem refuses it.
    pub(crate) fn open(path: &Path) -> io::Result<DirectFile> {
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)?;
            // Some filesystems (tmpfs) accept the flag at open and refuse the reads.
            let mut probe = DirectBuffer::default();
            probe.reserve(ALIGN as usize)?;
            file.read_at(&mut probe.map_mut()[..ALIGN as usize], 0)?;
            Ok(DirectFile(file))
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = path;
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "direct I/O is built for Linux only",
            ))
        }
    }

    /// Reads `len` bytes at `offset` into `buf` (grown as needed) and returns where in `buf`
    /// they lie.
    pub(crate) fn read(
        &self,
        offset: u64,
        len: usize,
        buf: &mut DirectBuffer,
    ) -> io::Result<Range<usize>> {
        let start = offset / ALIGN * ALIGN;
        let end = (offset + len as u64).div_ceil(ALIGN) * ALIGN;
        let span = (end - start) as usize;
        buf.reserve(span)?;
        let dst = &mut buf.map_mut()[..span];
        let mut done = 0;
        while done < span {
            match self.0.read_at(&mut dst[done..], start + done as u64) {
                // The file's end: what is left of the aligned span lies past it.
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let skip = (offset - start) as usize;
        if done < skip + len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{len} bytes at {offset}: the file ends first"),
            ));
        }
        Ok(skip..skip + len)
    }
}

/// A page-aligned buffer for direct reads, kept between reads.
#[derive(Default)]
pub struct DirectBuffer {
    map: Option<memmap2::MmapMut>,
}

impl DirectBuffer {
    fn reserve(&mut self, len: usize) -> io::Result<()> {
        if self.map.as_ref().is_none_or(|m| m.len() < len) {
            self.map = None;
            self.map = Some(memmap2::MmapMut::map_anon(len.max(ALIGN as usize))?);
        }
        Ok(())
    }

    /// The bytes a read put at `span` (as [`Gguf::read_direct_span`] gave it back).
    ///
    /// [`Gguf::read_direct_span`]: crate::Gguf::read_direct_span
    pub fn bytes(&self, span: Range<usize>) -> &[u8] {
        &self.map()[span]
    }

    fn map(&self) -> &[u8] {
        self.map.as_deref().unwrap_or_default()
    }

    fn map_mut(&mut self) -> &mut [u8] {
        self.map.as_deref_mut().unwrap_or_default()
    }
}
