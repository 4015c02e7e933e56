// The event loop's timers: a min-heap of deadlines in which a cancelled timer is removed at once.

/// Identifies a scheduled timer.
public struct TimerID: Hashable, Sendable {
    let raw: UInt64
}

/// A binary min-heap of deadlines with removal by id in O(log n): a cancelled timer leaves nothing behind (the
/// first slice left an entry until its deadline, so every finished request cost memory for its deadline's length).
/// Each timer holds a slot, which records where in the heap it sits; a `TimerID` is its slot and the slot's
/// generation, which changes when the slot is freed, so a stale id cancels nothing. (Positions were kept in a
/// Dictionary before: two hashed writes per swap, 3% of the daemon's loop with a deadline per request.)
struct TimerHeap {
    private struct Entry {
        var deadline: UInt64
        var slot: Int
        var body: () -> Void
    }
    private var heap: [Entry] = []
    /// Per slot: the heap index of its timer (-1 when free), and its generation.
    private var slots: [(index: Int, generation: UInt32)] = []
    private var freeSlots: [Int] = []

    /// Timers pending.
    var count: Int { heap.count }

    mutating func insert(deadline: UInt64, _ body: @escaping () -> Void) -> TimerID {
        let slot: Int
        if let reused = freeSlots.popLast() {
            slot = reused
        } else {
            slot = slots.count
            slots.append((-1, 0))
        }
        heap.append(Entry(deadline: deadline, slot: slot, body: body))
        slots[slot].index = heap.count - 1
        siftUp(heap.count - 1)
        return TimerID(raw: UInt64(slots[slot].generation) << 32 | UInt64(slot))
    }

    /// Returns the cancelled timer's body, so that the caller releases it (and whatever it captured, whose deinit
    /// may use the loop) after its access to the heap has ended.
    @discardableResult
    mutating func cancel(_ id: TimerID) -> (() -> Void)? {
        let slot = Int(id.raw & 0xFFFF_FFFF)
        guard slot < slots.count, slots[slot].generation == UInt32(id.raw >> 32), slots[slot].index >= 0 else { return nil }
        return remove(at: slots[slot].index)
    }

    /// The earliest deadline, if any.
    var nextDeadline: UInt64? { heap.first?.deadline }

    /// Removes and returns the body of the earliest timer due by `now`.
    mutating func popExpired(now: UInt64) -> (() -> Void)? {
        guard let top = heap.first, top.deadline <= now else { return nil }
        return remove(at: 0)
    }

    /// Removes the entry at `index`; returns its body (released by the caller, not inside this mutation).
    private mutating func remove(at index: Int) -> () -> Void {
        let removed = heap[index]
        slots[removed.slot].index = -1
        slots[removed.slot].generation &+= 1
        freeSlots.append(removed.slot)
        let last = heap.removeLast()
        guard index < heap.count else { return removed.body }
        heap[index] = last
        slots[last.slot].index = index
        if index > 0 && heap[(index - 1) / 2].deadline > last.deadline {
            siftUp(index)
        } else {
            siftDown(index)
        }
        return removed.body
    }

    private mutating func swapEntries(_ a: Int, _ b: Int) {
        heap.swapAt(a, b)
        slots[heap[a].slot].index = a
        slots[heap[b].slot].index = b
    }

    private mutating func siftUp(_ start: Int) {
        var i = start
        while i > 0 {
            let parent = (i - 1) / 2
            if heap[parent].deadline <= heap[i].deadline { break }
            swapEntries(parent, i)
            i = parent
        }
    }

    private mutating func siftDown(_ start: Int) {
        var i = start
        while true {
            let l = 2 * i + 1, r = l + 1
            var smallest = i
            if l < heap.count && heap[l].deadline < heap[smallest].deadline { smallest = l }
            if r < heap.count && heap[r].deadline < heap[smallest].deadline { smallest = r }
            if smallest == i { break }
            swapEntries(i, smallest)
            i = smallest
        }
    }
}
