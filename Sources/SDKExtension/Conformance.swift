// Conformance mode (docs/PROTOCOL.md "Conformance"): with SDKHOST_CONFORMANCE=1 in its environment (as
// `sdk-host conformance` starts it), a worker answers a request whose first item is titled `sdkhost.conformance`
// itself, whatever the extension's handler does; the item's text is the command. Every runtime (Swift, Python,
// C) implements the same commands, so that one suite checks any worker's protocol, whatever its handler does.
#if canImport(Glibc)
import Glibc
#endif
import SDKWire

enum Conformance {
    /// The first item's title that marks a conformance request.
    static let title = "sdkhost.conformance"

    /// Whether `items` is a conformance request (the caller checks that the mode is on).
    static func isCommand(_ items: [ExtensionItem]) -> Bool { items.first?.title == title }

    /// Answers one conformance request, on a thread of its own (`wait` and `stream` block it).
    static func handle(_ context: ExtensionContext) {
        let command = context.inputItems.first?.text ?? ""
        switch command {
        case "echo":
            context.completeRequest(returningItems: context.inputItems)
        case "wait":
            // Nothing until the host cancels.
            while !context.isCancelled { usleep(2_000) }
            context.cancelRequest(withError: .cancelledByHost)
        case _ where command.hasPrefix("stream:") && UInt32(command.dropFirst(7)) != nil:
            let count = Int(command.dropFirst(7))!
            for k in stride(from: 1, through: count, by: 1) where !context.send([ExtensionItem(text: "\(k)")]) {
                // The host cancelled (or the request ended): answer the cancel, as every runtime does.
                context.cancelRequest(withError: .cancelledByHost)
                return
            }
            context.completeRequest(returningItems: [ExtensionItem(text: "\(count)")])
        case "files":
            do {
                let reversed = try context.inputItems.flatMap(\.fileAttachments).map { file throws -> FileAttachment in
                    try FileAttachment(bytes: Array(try file.readAll().reversed()), name: "conformance-reversed")
                }
                context.completeRequest(returningItems: [ExtensionItem(title: "files", fileAttachments: reversed)])
            } catch {
                context.cancelRequest(withError: ExtensionError(domain: title, code: 3, message: "files: \(error)"))
            }
        case _ where command.hasPrefix("call:"):
            do {
                let answer = try context.callHost(String(command.dropFirst(5)), [ExtensionItem(text: "ping")])
                context.completeRequest(returningItems: answer)
            } catch let error as ExtensionError {
                context.cancelRequest(withError: error)
            } catch {
                context.cancelRequest(withError: ExtensionError(domain: title, code: 4, message: "call: \(error)"))
            }
        default:
            context.cancelRequest(withError: ExtensionError(domain: title, code: 2, message: "unknown command \(command)"))
        }
    }
}
