// The zip container of .npz files (io/detail/zip.hpp): a reader that checks the whole central
// directory before decoding a member (zip64, stored and deflate members, CRC-32, overlapping
// or duplicate members refused) and a writer of stored members, as np.savez writes them.
#include <xgrad/io/detail/zip.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include <xgrad/core/error.hpp>
#include <xgrad/io/detail/bytes.hpp>
#include <xgrad/io/detail/inflate.hpp>

namespace xg::io::detail {

namespace {

const char kNpyMagic[] = "\x93NUMPY";  // 6 bytes: a .npy file given where an .npz was expected

const std::uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                    kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;

std::string zip_where(const std::string& where, const std::string& member) {
  return where + "member '" + printable(member) + "': ";
}

// Where the central directory lies, as the end record (or the zip64 end record) declares it.
struct CentralDirectory {
  std::uint64_t entries, size, offset;
  std::uint64_t end;  // where the central directory must end: where the (zip64) end record starts
};

// One member, as its central directory entry describes it and its local header places its data.
struct Member {
  std::string name, where;
  std::uint32_t method, crc;
  std::uint64_t local, data, csize, usize;
};

// The offset of the end-of-central-directory record: 22 bytes plus a comment of up to 65535
// bytes, searched from the end of the archive.
std::size_t find_end_record(const unsigned char* b, std::size_t size, const std::string& where) {
  if (size < 22)
    throw FormatError(where + "not a zip archive (.npz): " + std::to_string(size) + " bytes, fewer than a zip end record");
  for (std::size_t k = size - 22 + 1; k-- > 0 && size - k <= 22 + 65535;) {
    if (get_le(b + k, 4) == kEndSig && get_le(b + k + 20, 2) == size - k - 22) return k;
  }
  if (size >= 6 && std::memcmp(b, kNpyMagic, 6) == 0)
    throw FormatError(where + "this is a .npy file, not an .npz archive: use load / read");
  throw FormatError(where + "not a zip archive (.npz): no end-of-central-directory record");
}

// The central directory declared by the end record at `end` (single disk only), or by the zip64
// end record when a zip64 locator precedes it; checked to end where that record starts and to
// have room for its entries.
CentralDirectory read_end_records(const unsigned char* b, std::size_t end, const std::string& where) {
  if (get_le(b + end + 4, 2) != 0 || get_le(b + end + 6, 2) != 0)
    throw FormatError(where + "multi-disk (split) zip archives are not supported");
  CentralDirectory cd{get_le(b + end + 10, 2), get_le(b + end + 12, 4), get_le(b + end + 16, 4), end};
  if (get_le(b + end + 8, 2) != cd.entries)
    throw FormatError(where + "multi-disk (split) zip archives are not supported");
  // zip64: a locator just before the end record points to the zip64 end record.
  if (end >= 20 && get_le(b + end - 20, 4) == kLocator64Sig) {
    const std::uint64_t at = get_le(b + end - 20 + 8, 8);
    if (get_le(b + end - 20 + 4, 4) != 0 || get_le(b + end - 20 + 16, 4) > 1)
      throw FormatError(where + "multi-disk (split) zip archives are not supported");
    if (at > end - 20 || end - 20 - at < 56 || get_le(b + at, 4) != kEnd64Sig)
      throw FormatError(where + "the zip64 locator points to no zip64 end record");
    if (get_le(b + at + 16, 4) != 0 || get_le(b + at + 20, 4) != 0 || get_le(b + at + 24, 8) != get_le(b + at + 32, 8))
      throw FormatError(where + "multi-disk (split) zip archives are not supported");
    cd.entries = get_le(b + at + 32, 8);
    cd.size = get_le(b + at + 40, 8);
    cd.offset = get_le(b + at + 48, 8);
    cd.end = at;
  }
  if (cd.offset > cd.end || cd.size != cd.end - cd.offset)
    throw FormatError(where + "the central directory (" + std::to_string(cd.size) + " bytes at offset " +
                      std::to_string(cd.offset) + ") does not end where the end record starts (" +
                      std::to_string(cd.end) + "): a damaged archive, or data before it");
  if (cd.entries > cd.size / 46)
    throw FormatError(where + "the end record declares " + std::to_string(cd.entries) +
                      " members, more than fit in the " + std::to_string(cd.size) + "-byte central directory");
  return cd;
}

// zip64 extended information in an entry's extra fields (`x`, `extra_len` bytes): the fields
// saturated in the entry, in this order, replaced by their 8-byte (disk: 4-byte) values.
void read_zip64_extra(const unsigned char* x, std::size_t extra_len, const std::string& mw, std::uint64_t& usize,
                      std::uint64_t& csize, std::uint64_t& local, std::uint64_t& disk) {
  for (std::size_t k = 0; k + 4 <= extra_len;) {
    const std::uint32_t id = static_cast<std::uint32_t>(get_le(x + k, 2));
    const std::size_t len = get_le(x + k + 2, 2);
    if (k + 4 + len > extra_len) throw FormatError(mw + "damaged extra field");
    if (id == 1) {
      std::size_t q = k + 4;
      auto take = [&](std::uint64_t& field, std::uint64_t saturated, int bytes) {
        if (field != saturated) return;
        if (q + bytes > k + 4 + len) throw FormatError(mw + "the zip64 extra field is too short");
        field = get_le(x + q, bytes);
        q += bytes;
      };
      take(usize, 0xFFFFFFFF, 8);
      take(csize, 0xFFFFFFFF, 8);
      take(local, 0xFFFFFFFF, 8);
      take(disk, 0xFFFF, 4);
    }
    k += 4 + len;
  }
}

// Where member `m` (named `member` in the archive) has its data: after its local header, which
// must repeat the entry's method and name; the data must end before the central directory at
// `cd_offset`, and its sizes be possible for its method.
std::uint64_t locate_data(const unsigned char* b, std::uint64_t cd_offset, const Member& m, const std::string& member) {
  const std::string& mw = m.where;
  const std::uint64_t local = m.local, csize = m.csize, usize = m.usize;
  const std::size_t name_len = member.size();
  // The local header repeats the name; the data follows it.
  if (local > cd_offset || cd_offset - local < 30 || get_le(b + local, 4) != kLocalSig)
    throw FormatError(mw + "its local header at offset " + std::to_string(local) + " is missing or damaged");
  const unsigned char* l = b + local;
  const std::size_t lname = get_le(l + 26, 2), lextra = get_le(l + 28, 2);
  if (get_le(l + 8, 2) != m.method || lname != name_len || cd_offset - local - 30 < lname ||
      std::memcmp(l + 30, member.data(), name_len) != 0)
    throw FormatError(mw + "its local header does not match the central directory");
  const std::uint64_t data = local + 30 + lname + lextra;
  if (data > cd_offset || csize > cd_offset - data)
    throw FormatError(mw + "its " + std::to_string(csize) + " data bytes run past the central directory");
  if (m.method == 0 && csize != usize)
    throw FormatError(mw + "is stored with " + std::to_string(csize) + " bytes but declares " +
                      std::to_string(usize) + " uncompressed");
  // Deflate expands at most ~1032:1; a larger claim cannot be true (and must not be allocated).
  if (m.method == 8 && usize / 1032 > csize + 1)
    throw FormatError(mw + "declares " + std::to_string(usize) + " bytes from " + std::to_string(csize) +
                      " compressed: more than deflate can expand");
  return data;
}

// Central directory entry `e`, at `pos` (moved past it): a stored or deflate NAME.npy member on
// this disk, not encrypted, its NAME not yet in `names` (added), its data located.
Member read_central_entry(const unsigned char* b, const CentralDirectory& cd, std::uint64_t e, std::uint64_t& pos,
                          std::set<std::string>& names, const std::string& where) {
  if (cd.end - pos < 46 || get_le(b + pos, 4) != kCentralSig)
    throw FormatError(where + "central directory entry " + std::to_string(e) + " is damaged");
  const unsigned char* c = b + pos;
  const std::uint32_t flags = static_cast<std::uint32_t>(get_le(c + 8, 2));
  const std::uint32_t method = static_cast<std::uint32_t>(get_le(c + 10, 2));
  const std::uint32_t crc = static_cast<std::uint32_t>(get_le(c + 16, 4));
  std::uint64_t csize = get_le(c + 20, 4), usize = get_le(c + 24, 4);
  const std::size_t name_len = get_le(c + 28, 2), extra_len = get_le(c + 30, 2), comment_len = get_le(c + 32, 2);
  std::uint64_t disk = get_le(c + 34, 2), local = get_le(c + 42, 4);
  if (cd.end - pos - 46 < name_len + extra_len + comment_len)
    throw FormatError(where + "central directory entry " + std::to_string(e) + " runs past the directory");
  const std::string member(reinterpret_cast<const char*>(c + 46), name_len);
  const std::string mw = zip_where(where, member);
  read_zip64_extra(c + 46 + name_len, extra_len, mw, usize, csize, local, disk);
  pos += 46 + name_len + extra_len + comment_len;
  if (disk != 0) throw FormatError(mw + "lies on another disk: multi-disk archives are not supported");
  if (flags & 1) throw FormatError(mw + "is encrypted, which is not supported");
  if (method != 0 && method != 8)
    throw FormatError(mw + "uses compression method " + std::to_string(method) +
                      (method == 12 ? " (bzip2)" : method == 14 ? " (lzma)" : "") +
                      "; only stored (np.savez) and deflate (np.savez_compressed) members are read");
  if (member.size() < 5 || member.compare(member.size() - 4, 4, ".npy") != 0)
    throw FormatError(mw + "is not a .npy member (an .npz holds only NAME.npy files)");
  const std::string name = member.substr(0, member.size() - 4);
  if (!names.insert(name).second) throw FormatError(mw + "appears twice");
  Member m{name, mw, method, crc, local, 0, csize, usize};
  m.data = locate_data(b, cd.offset, m, member);
  return m;
}

// Members may not share bytes (overlapping entries would let a small file inflate many times).
void check_no_overlap(const std::vector<Member>& members) {
  std::vector<const Member*> order;
  for (const Member& m : members) order.push_back(&m);
  std::sort(order.begin(), order.end(), [](const Member* a, const Member* b) { return a->local < b->local; });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (order[i]->local < order[i - 1]->data + order[i - 1]->csize)
      throw FormatError(order[i]->where + "overlaps member '" + printable(order[i - 1]->name) + ".npy'");
}

// Member `m` of the archive `z`: decoded, its CRC-32 checked, its .npy bytes handed to `visit`.
template <class Visit> void decode_member(const std::string& z, const Member& m, const Visit& visit) {
  const auto* b = reinterpret_cast<const unsigned char*>(z.data());
  std::string inflated;
  const char* bytes = z.data() + m.data;
  std::size_t n_bytes = static_cast<std::size_t>(m.csize);
  if (m.method == 8) {
    inflated = inflate_raw(b + m.data, static_cast<std::size_t>(m.csize), static_cast<std::size_t>(m.usize), m.where);
    bytes = inflated.data();
    n_bytes = inflated.size();
  }
  const std::uint32_t got = crc32(bytes, n_bytes);
  if (got != m.crc) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "CRC-32 is %08x, the archive says %08x", got, m.crc);
    throw FormatError(m.where + buf + ": the data is damaged");
  }
  visit(m.name, m.where, bytes, n_bytes);
}

}  // namespace

void read_npz_zip(const std::string& z, const std::string& where,
                  const std::function<void(const std::string& name, const std::string& member_where, const char* bytes,
                                           std::size_t n)>& visit) {
  require_little_endian_host(where);
  const auto* b = reinterpret_cast<const unsigned char*>(z.data());
  const CentralDirectory cd = read_end_records(b, find_end_record(b, z.size(), where), where);
  // First pass: the central directory, checked whole before any member is decoded.
  std::vector<Member> members;
  std::set<std::string> names;
  std::uint64_t pos = cd.offset;
  for (std::uint64_t e = 0; e < cd.entries; ++e) members.push_back(read_central_entry(b, cd, e, pos, names, where));
  if (pos != cd.end) throw FormatError(where + "the central directory has bytes after its last entry");
  check_no_overlap(members);
  // Second pass: decode, check the CRC, hand the .npy bytes to the caller.
  for (const Member& m : members) decode_member(z, m, visit);
}

std::string write_stored_zip(const std::vector<std::string>& members,
                             const std::function<std::string(std::size_t)>& bytes_of, const std::string& where) {
  std::string out, central;
  for (std::size_t i = 0; i < members.size(); ++i) {
    const std::string& member = members[i];
    const std::string data = bytes_of(i);
    const std::uint32_t crc = crc32(data.data(), data.size());
    if (data.size() >= 0xFFFFFFFFu || out.size() >= 0xFFFFFFFFu - 30 - member.size() - data.size())
      throw FormatError(where + "the archive would exceed 4 GiB: save_npz writes no zip64");
    bool ascii = true;
    for (const char ch : member) ascii = ascii && static_cast<unsigned char>(ch) < 128;
    const std::uint32_t flags = ascii ? 0 : 0x800;  // bit 11: the name is UTF-8
    const std::uint64_t offset = out.size();
    // Local file header. Time 00:00, date 1980-01-01 (files are reproducible).
    put_le(out, kLocalSig, 4);
    put_le(out, 20, 2);
    put_le(out, flags, 2);
    put_le(out, 0, 2);  // stored
    put_le(out, 0, 2);
    put_le(out, (0 << 9) | (1 << 5) | 1, 2);
    put_le(out, crc, 4);
    put_le(out, data.size(), 4);
    put_le(out, data.size(), 4);
    put_le(out, member.size(), 2);
    put_le(out, 0, 2);
    out += member;
    out += data;
    // Its central directory entry.
    put_le(central, kCentralSig, 4);
    put_le(central, (3 << 8) | 20, 2);  // made by: Unix, zip 2.0
    put_le(central, 20, 2);
    put_le(central, flags, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, (0 << 9) | (1 << 5) | 1, 2);
    put_le(central, crc, 4);
    put_le(central, data.size(), 4);
    put_le(central, data.size(), 4);
    put_le(central, member.size(), 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, 0, 2);
    put_le(central, std::uint64_t(0100644) << 16, 4);  // a regular file, rw-r--r--
    put_le(central, offset, 4);
    central += member;
  }
  if (out.size() + central.size() >= 0xFFFFFFFFu)
    throw FormatError(where + "the archive would exceed 4 GiB: save_npz writes no zip64");
  const std::uint64_t cd_offset = out.size();
  out += central;
  put_le(out, kEndSig, 4);
  put_le(out, 0, 2);
  put_le(out, 0, 2);
  put_le(out, members.size(), 2);
  put_le(out, members.size(), 2);
  put_le(out, central.size(), 4);
  put_le(out, cd_offset, 4);
  put_le(out, 0, 2);
  return out;
}

}  // namespace xg::io::detail
