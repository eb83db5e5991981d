// The own-write rule where the app takes an event: the newest state each of this client's writes produced,
// so a watch can hold back a state that was sent before the write but taken by the app after it.

/** What the record reads of an object: its uid and resourceVersion. */
interface Versioned {
  uid: string;
  resourceVersion: string;
}

/**
 * How many objects the record remembers. An entry only matters while a state of its object older than the
 * write can still be on its way to, or queued in, one of this client's watches: the daemon judged that state
 * before the write reached it, and everything it sends after the write already honours the write. That
 * window closes as the app takes its events, so the entries worth keeping are the recently written ones;
 * a long-running controller writes to ever more objects (every one a new uid once re-created), and an
 * unbounded map would grow with all of them. 10,000 entries (a uid and a bigint each, about 1–2 MB) cover
 * far more writes than the events a watch can have queued.
 */
export const OWN_WRITES_LIMIT = 10_000;

/** A resourceVersion as an integer, or undefined when it is not a decimal integer (then it is never compared). */
export function versionNumber(resourceVersion: string): bigint | undefined {
  return /^[0-9]+$/.test(resourceVersion) ? BigInt(resourceVersion) : undefined;
}

/**
 * Per object uid, the largest resourceVersion that a write through the client's `objects` returned. One per
 * client (connection), shared by all its watches; a write through one client is unknown to another.
 */
export class OwnWrites {
  /** uid -> largest version written; in order of the last write, oldest first (what is forgotten first). */
  private readonly versions = new Map<string, bigint>();

  constructor(private readonly limit = OWN_WRITES_LIMIT) {}

  /** Records the state a write returned (nothing when its uid is empty or its version is not an integer). */
  record(object: Versioned | undefined): void {
    if (!object?.uid) return;
    const version = versionNumber(object.resourceVersion);
    if (version === undefined) return;
    const known = this.versions.get(object.uid);
    // Re-inserting moves the uid to the newest end, so the least recently written object is forgotten first.
    this.versions.delete(object.uid);
    this.versions.set(object.uid, known !== undefined && known > version ? known : version);
    if (this.versions.size > this.limit) {
      const oldest = this.versions.keys().next().value;
      if (oldest !== undefined) this.versions.delete(oldest);
    }
  }

  /**
   * Whether `object` is older than a state this client's own write produced: its uid is recorded with a
   * larger version. Equal or larger versions, unknown uids and non-integer versions are not.
   */
  predates(object: Versioned | undefined): boolean {
    if (!object?.uid) return false;
    const written = this.versions.get(object.uid);
    if (written === undefined) return false;
    const version = versionNumber(object.resourceVersion);
    return version !== undefined && version < written;
  }

  /**
   * Whether `object` is exactly the newest state this client's own writes returned for its uid: the uid is
   * recorded with this very version (compared as integers). A newest-state watch asks it to tell the state of
   * the app's own write from anyone else's. Unknown uids, other versions and non-integer versions are not.
   */
  wrote(object: Versioned | undefined): boolean {
    if (!object?.uid) return false;
    const written = this.versions.get(object.uid);
    if (written === undefined) return false;
    return versionNumber(object.resourceVersion) === written;
  }

  /** How many objects are recorded. */
  get size(): number {
    return this.versions.size;
  }
}
