// The leak check as a test assertion, for Swift Testing and for XCTest.
import Testing
import XCTest

/// Builds a graph with `make`, lets go of it, and records a test issue naming every object of it that is
/// still alive a little later, with its path (`root.cache.delegate`). For Swift Testing.
///
/// ```swift
/// @Test func parserLeaksNothing() async {
///     await expectNoLeaks { Parser(cache: Cache()) }
/// }
/// ```
///
/// - Parameters:
///   - delay: How long to wait before the first look.
///   - timeout: How much longer to wait for survivors before reporting them.
///   - make: Creates the graph and returns its root; keep no other reference to it.
/// - Returns: The report, for further checks.
@discardableResult
public func expectNoLeaks(
    delay: Duration = .milliseconds(50), timeout: Duration = .seconds(1),
    sourceLocation: SourceLocation = #_sourceLocation, _ make: () throws -> AnyObject
) async rethrows -> LeakReport {
    let report = try await LeakCheck.run(delay: delay, timeout: timeout, make)
    if !report.isClean {
        Issue.record(Comment(rawValue: "leaked: \(report)"), sourceLocation: sourceLocation)
    }
    return report
}

/// The same check for XCTest: fails the test with every survivor and its path.
///
/// ```swift
/// func testParserLeaksNothing() async {
///     await XCTAssertNoLeaks { Parser(cache: Cache()) }
/// }
/// ```
@discardableResult
public func XCTAssertNoLeaks(
    delay: Duration = .milliseconds(50), timeout: Duration = .seconds(1),
    file: StaticString = #filePath, line: UInt = #line, _ make: () throws -> AnyObject
) async rethrows -> LeakReport {
    let report = try await LeakCheck.run(delay: delay, timeout: timeout, make)
    if !report.isClean {
        XCTFail("leaked: \(report)", file: file, line: line)
    }
    return report
}
