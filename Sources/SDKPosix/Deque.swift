// Deque: a ring-buffer FIFO with O(1) append and popFirst. The event loop's task inbox uses it; queues that
// drained with removeFirst() were O(n) per operation (1M queued requests never drained).

/// A first-in, first-out queue on a growable ring buffer.
package struct Deque<Element> {
    private var storage: [Element?] = []
    private var head = 0
    package private(set) var count = 0

    package init() {}

    package var isEmpty: Bool { count == 0 }

    /// The element `popFirst` would return, left in place.
    package var first: Element? { count > 0 ? storage[head] : nil }

    /// Runs `body` on the first element in place (there must be one).
    package mutating func withFirst<R>(_ body: (inout Element) -> R) -> R {
        precondition(count > 0, "withFirst on an empty Deque")
        return body(&storage[head]!)
    }

    package mutating func append(_ element: Element) {
        if count == storage.count { grow() }
        storage[(head + count) % storage.count] = element
        count += 1
    }

    package mutating func popFirst() -> Element? {
        guard count > 0 else { return nil }
        let element = storage[head].take()
        head = (head + 1) % storage.count
        count -= 1
        if count == 0 {
            head = 0
            if storage.count > 1024 { storage = [] }  // a burst does not pin its peak capacity
        }
        return element
    }

    private mutating func grow() {
        let newCapacity = max(16, storage.count * 2)
        var bigger = [Element?](repeating: nil, count: newCapacity)
        for i in 0..<count { bigger[i] = storage[(head + i) % storage.count].take() }
        storage = bigger
        head = 0
    }
}
