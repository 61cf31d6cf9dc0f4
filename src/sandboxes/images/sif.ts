import { open } from 'node:fs/promises';
import { RolloutError } from '../../errors.js';

/**
 * Reading the Singularity Image Format (SIF, spec version 01, as written by siftool and Apptainer) just far
 * enough to mount an image without Apptainer: find the primary system partition and where its squashfs lies.
 *
 * Layout (little-endian, packed, as Go's encoding/binary writes it):
 * - global header, 128 bytes at 0: launch script [32], magic "SIF_MAGIC\0" [10], version "01\0" [3], arch [3],
 *   uuid [16], created int64, modified int64, descriptors free int64, descriptors total int64,
 *   descriptors offset int64, descriptors size int64, data offset int64, data size int64;
 * - `total` descriptors of 585 bytes each from the descriptors offset: data type int32, used bool, id uint32,
 *   group uint32, link uint32, offset int64, size int64, size with padding int64, created int64, modified int64,
 *   uid int64, gid int64, name [128], extra [384]; a partition's extra starts with fs type int32, partition type
 *   int32, arch [3].
 */
export const SIF_HEADER_SIZE = 128;
export const SIF_DESCRIPTOR_SIZE = 585;
/** More descriptors than any real image holds (siftool makes 48); bounds what a hostile header can make us read. */
export const SIF_MAX_DESCRIPTORS = 4096;

const MAGIC = 'SIF_MAGIC';
const DATA_PARTITION = 0x4004;
const FS_SQUASHFS = 1;
const FS_ENCRYPTED_SQUASHFS = 5;
const PART_PRIMARY_SYSTEM = 2;
const SQUASHFS_MAGIC = 'hsqs';
const SQUASHFS_SUPERBLOCK_SIZE = 96;

/** SIF's architecture codes ("02" is amd64) to Node's `process.arch` names. */
const ARCHES: Readonly<Record<string, string>> = {
  '01': 'ia32',
  '02': 'x64',
  '03': 'arm',
  '04': 'arm64',
  '05': 'ppc64',
  '06': 'ppc64le',
  '07': 'mips',
  '08': 'mipsel',
  '09': 'mips64',
  '10': 'mips64el',
  '11': 's390x',
  '12': 'riscv64',
};

/** Where the root file system of a SIF lies: mount `path` as squashfs at byte `offset`. */
export interface SifSystemPartition {
  /** Byte offset of the squashfs image inside the SIF file. */
  offset: number;
  /** Bytes of the partition (the squashfs image ends within them). */
  size: number;
  /** The partition's architecture as Node names it (`process.arch`), or undefined when the SIF leaves it unset. */
  arch: string | undefined;
  /** The descriptor's object id, for messages. */
  id: number;
}

/** Random access to the bytes of a SIF; reads past the end return fewer bytes. */
export interface ByteSource {
  readonly size: number;
  read(offset: number, length: number): Promise<Uint8Array>;
}

/**
 * Finds the primary system partition of a SIF and checks it holds a squashfs that lies wholly inside the file.
 * Never throws anything but RolloutError('sandbox_error') whose message names `name` and the reason (not a
 * SIF, unsupported version, truncated, no primary system partition, not squashfs, encrypted); bytes are only
 * read at offsets the header allows and within the file.
 */
export async function locateSystemPartition(source: ByteSource, name: string): Promise<SifSystemPartition> {
  const fail = (reason: string): never => {
    throw new RolloutError('sandbox_error', `${name} is not a usable SIF image: ${reason}`);
  };
  if (source.size < SIF_HEADER_SIZE) fail(`truncated: ${source.size} bytes, shorter than the ${SIF_HEADER_SIZE}-byte SIF header`);
  const header = view(await source.read(0, SIF_HEADER_SIZE));
  if (header.byteLength < SIF_HEADER_SIZE) fail('truncated header');
  if (text(header, 32, 10) !== MAGIC) fail('no SIF_MAGIC at byte 32 (not a SIF file)');
  const version = text(header, 42, 3);
  if (version !== '01') fail(`SIF version "${printable(version)}" is not supported (only 01)`);
  const total = int64(header, 88);
  const descriptorsOffset = int64(header, 96);
  if (total === undefined || total < 0 || total > SIF_MAX_DESCRIPTORS) fail(`implausible descriptor count ${String(total)}`);
  if (descriptorsOffset === undefined || descriptorsOffset < SIF_HEADER_SIZE) fail(`implausible descriptor table offset ${String(descriptorsOffset)}`);
  const tableSize = total! * SIF_DESCRIPTOR_SIZE;
  if (descriptorsOffset! + tableSize > source.size) fail(`truncated: the descriptor table ends at byte ${descriptorsOffset! + tableSize}, past the file's ${source.size} bytes`);
  const table = view(await source.read(descriptorsOffset!, tableSize));
  if (table.byteLength < tableSize) fail('truncated descriptor table');

  let primary: { at: number; id: number } | undefined;
  for (let i = 0; i < total!; i++) {
    const at = i * SIF_DESCRIPTOR_SIZE;
    if (table.getUint8(at + 4) === 0 || table.getInt32(at, true) !== DATA_PARTITION) continue;
    if (table.getInt32(at + 201 + 4, true) !== PART_PRIMARY_SYSTEM) continue;
    if (primary) fail(`two primary system partitions (objects ${primary.id} and ${table.getUint32(at + 5, true)})`);
    primary = { at, id: table.getUint32(at + 5, true) };
  }
  if (!primary) fail('no primary system partition');
  const { at, id } = primary!;
  const fsType = table.getInt32(at + 201, true);
  if (fsType === FS_ENCRYPTED_SQUASHFS) fail(`the system partition (object ${id}) is encrypted`);
  if (fsType !== FS_SQUASHFS) fail(`the system partition (object ${id}) is not squashfs (fs type ${fsType})`);
  const offset = int64(table, at + 17);
  const size = int64(table, at + 25);
  if (offset === undefined || size === undefined || offset < SIF_HEADER_SIZE || size < SQUASHFS_SUPERBLOCK_SIZE) {
    fail(`the system partition (object ${id}) has an implausible extent (offset ${String(offset)}, size ${String(size)})`);
  }
  if (offset! + size! > source.size) fail(`truncated: the system partition (object ${id}) ends at byte ${offset! + size!}, past the file's ${source.size} bytes`);
  const superblock = view(await source.read(offset!, SQUASHFS_SUPERBLOCK_SIZE));
  if (superblock.byteLength < SQUASHFS_SUPERBLOCK_SIZE || text(superblock, 0, 4, false) !== SQUASHFS_MAGIC) {
    fail(`the system partition (object ${id}) does not start with a squashfs superblock`);
  }
  const bytesUsed = int64(superblock, 40);
  if (bytesUsed === undefined || bytesUsed > size!) fail(`the squashfs of object ${id} claims ${String(bytesUsed)} bytes, more than its ${size} byte partition`);
  const archCode = text(table, at + 201 + 8, 3);
  return { offset: offset!, size: size!, arch: ARCHES[archCode], id };
}

/** {@link locateSystemPartition} on a file; I/O failures (missing, unreadable) become sandbox_error too. */
export async function readSifFile(path: string): Promise<SifSystemPartition> {
  let handle;
  try {
    handle = await open(path, 'r');
  } catch (err) {
    throw new RolloutError('sandbox_error', `cannot open SIF image ${path}: ${(err as Error).message}`, { cause: err });
  }
  try {
    const { size } = await handle.stat();
    const source: ByteSource = {
      size,
      read: async (offset, length) => {
        const buffer = Buffer.alloc(Math.max(0, Math.min(length, size - offset)));
        const { bytesRead } = await handle.read(buffer, 0, buffer.length, offset);
        return buffer.subarray(0, bytesRead);
      },
    };
    return await locateSystemPartition(source, path);
  } catch (err) {
    if (err instanceof RolloutError) throw err;
    throw new RolloutError('sandbox_error', `cannot read SIF image ${path}: ${(err as Error).message}`, { cause: err });
  } finally {
    await handle.close();
  }
}

/** An in-memory ByteSource (tests, or an image already read). */
export function bytesSource(bytes: Uint8Array): ByteSource {
  return { size: bytes.byteLength, read: async (offset, length) => bytes.subarray(offset, offset + length) };
}

function view(bytes: Uint8Array): DataView {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** A non-negative int64 as a safe integer, or undefined when negative or past 2^53. */
function int64(data: DataView, at: number): number | undefined {
  const value = data.getBigInt64(at, true);
  return value < 0n || value > BigInt(Number.MAX_SAFE_INTEGER) ? undefined : Number(value);
}

/** Bytes as latin1 text, up to the first NUL when `nulTerminated`. */
function text(data: DataView, at: number, length: number, nulTerminated = true): string {
  let out = '';
  for (let i = 0; i < length; i++) {
    const byte = data.getUint8(at + i);
    if (nulTerminated && byte === 0) break;
    out += String.fromCharCode(byte);
  }
  return out;
}

function printable(value: string): string {
  return value.replace(/[^\x20-\x7e]/g, '?');
}
