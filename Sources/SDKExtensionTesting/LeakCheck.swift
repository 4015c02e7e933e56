// The leak check: build an object graph, let go of it, and see what is still alive a little later.
//
// In the manner of XCTAssertNoLeak (walk the graph with Mirror, hold every object weakly, report the survivors
// with their paths) and MLeaksFinder (check a little after the object should be gone, not at once, so that
// work already queued can finish). Only stored properties are followed: an object reachable only through a
// closure's captures is not found by the walk, but whatever holds the closure is, and that is what a capture
// cycle keeps alive (`root`, for a closure or Task capturing `self`).

/// A type whose listed stored properties the leak check does not follow: references meant to outlive the
/// graph under test, such as shared singletons or an injected long-lived service.
public protocol LeakCheckExempting {
    /// Names of stored properties, as declared, that the check must not follow.
    static var leakCheckExemptProperties: Set<String> { get }
}

/// What a leak check found.
public struct LeakReport: Sendable, Equatable, CustomStringConvertible {
    /// One object still alive after the graph was let go.
    public struct Survivor: Sendable, Equatable, CustomStringConvertible {
        /// The shortest path the walk found to it, from `root`: `root.cache.delegate`, `root.items[2]`.
        public var path: String
        /// Its dynamic type.
        public var typeName: String
        public var description: String { "\(path) (\(typeName))" }
    }

    /// Every object still alive, in the order the walk met them (shortest paths first).
    public var survivors: [Survivor]
    /// How many objects the walk found.
    public var objectsChecked: Int

    /// True if nothing survived.
    public var isClean: Bool { survivors.isEmpty }

    public var description: String {
        isClean ? "no leaks among \(objectsChecked) object(s)"
            : "\(survivors.count) of \(objectsChecked) object(s) still alive: "
                + survivors.map(\.description).joined(separator: ", ")
    }
}

/// Runs leak checks. Use `expectNoLeaks` (Swift Testing) or `XCTAssertNoLeaks` (XCTest) in tests; this is the
/// part both share, for a report of your own.
public enum LeakCheck {
    /// The most objects one check follows (a bound for graphs that are really data, not structure).
    public static let maximumObjects = 100_000

    /// Builds a graph with `make`, walks it, drops it, and reports what is still alive once `delay` has passed
    /// and, for up to `timeout` more, while anything still is.
    ///
    /// - Parameters:
    ///   - delay: How long to wait before the first look (work queued by the graph may still hold it briefly).
    ///   - timeout: How much longer to wait for survivors to go before reporting them.
    ///   - make: Creates the graph and returns its root; nothing else may keep the root.
    public static func run(
        delay: Duration = .milliseconds(50), timeout: Duration = .seconds(1), _ make: () throws -> AnyObject
    ) async rethrows -> LeakReport {
        let watched = try watch(make)
        try? await Task.sleep(for: delay)
        await waitWhile(timeout: timeout) { watched.contains(where: \.isAlive) }
        let survivors = watched.filter(\.isAlive).map { LeakReport.Survivor(path: $0.path, typeName: $0.typeName) }
        return LeakReport(survivors: survivors, objectsChecked: watched.count)
    }

    /// Creates the graph and returns weak references to every object in it; the graph itself is released when
    /// this returns (nothing here keeps a strong reference).
    @inline(never)
    static func watch(_ make: () throws -> AnyObject) rethrows -> [WeakReference] {
        let root = try make()
        return walk(root)
    }

    /// Breadth first, so each object is named by its shortest path.
    @inline(never)
    static func walk(_ root: AnyObject) -> [WeakReference] {
        var found: [WeakReference] = []
        var seen: Set<ObjectIdentifier> = []
        var pending: [(value: Any, path: String)] = [(root, "root")]
        var next = 0
        while next < pending.count, found.count < maximumObjects {
            let (value, path) = pending[next]
            pending[next] = ((), "")  // let go of it as soon as it is walked
            next += 1
            let mirror = Mirror(reflecting: value)
            var exempt: Set<String> = []
            if mirror.displayStyle == .class {
                let object = value as AnyObject
                guard seen.insert(ObjectIdentifier(object)).inserted else { continue }
                found.append(WeakReference(object, path: path))
                exempt = (type(of: object) as? LeakCheckExempting.Type)?.leakCheckExemptProperties ?? []
            }
            var level: Mirror? = mirror
            while let current = level {
                for (index, child) in current.children.enumerated() {
                    if let label = child.label, exempt.contains(label) { continue }
                    pending.append((child.value, childPath(path, style: current.displayStyle, label: child.label,
                                                           index: index, value: child.value)))
                }
                level = current.superclassMirror
            }
        }
        return found
    }

    /// `path.label` for a property, `path[i]` for an element, `path[key]` for a dictionary entry (whose
    /// tuple the walk then passes through with the same path), `path` for an optional's payload.
    static func childPath(_ path: String, style: Mirror.DisplayStyle?, label: String?, index: Int, value: Any) -> String {
        switch style {
        case .optional?: return path
        case .collection?, .set?: return "\(path)[\(index)]"
        case .dictionary?:
            let key = Mirror(reflecting: value).children.first.map { String(describing: $0.value) } ?? String(index)
            return "\(path)[\(key)]"
        case .tuple? where path.hasSuffix("]"):
            // A dictionary entry's (key, value): only the value is part of the path.
            return label == "value" || label == ".1" ? path : "\(path).key"
        default:
            guard let label else { return "\(path)[\(index)]" }
            return "\(path).\(label)"
        }
    }
}

/// Polls `condition` every 10 ms while it holds, for at most `timeout`.
func waitWhile(timeout: Duration, _ condition: () -> Bool) async {
    let clock = ContinuousClock()
    let end = clock.now.advanced(by: timeout)
    while condition(), clock.now < end {
        try? await Task.sleep(for: .milliseconds(10))
    }
}

/// A weak reference with where it was found.
final class WeakReference: @unchecked Sendable {
    weak var object: AnyObject?
    let path: String
    let typeName: String

    init(_ object: AnyObject, path: String) {
        self.object = object
        self.path = path
        typeName = String(describing: type(of: object))
    }

    var isAlive: Bool { object != nil }
}
