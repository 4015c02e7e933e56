// Renderer (com.example.renderer): renders a document whose parts it cannot read itself. The first input item's
// text (or, without one, its title) is the document; each `{{name}}` in it is a part that only the app has, asked for with the host service
// `document.part` (the part's name as the item's title; its text comes back). Without the service the request
// is cancelled with the service's error: the extension cannot do its job alone, which is the point of host services.
//
// For tests, the first item's title picks something else:
//   "hold:<n>"       make n calls to `document.part` at once (parts "hold-1"...) and wait for all of them
//   "crash-in-call"  make one call, then die with SIGABRT while it runs in the app
//   "unlisted"       call `secret.key`, which the manifest does not list, and complete with the error's text
//   "over-cap:<n>"   make n calls at once (more than MaxHostCallsInFlight) and complete with how many failed at once
//   "blocking"       as the default, with the blocking form of callHost, from a thread of a global queue
//   "file"           send the app a file (the bytes "sealed part") with the call; complete with the text of the
//                    file the app sends back
//   "end-with-call"  start a call in a Task of its own and complete at once, with the call still out
import SDKExtension
import Dispatch
#if canImport(Glibc)
import Glibc
#endif

@main
struct Renderer: AsyncRequestHandler {
    func beginRequest(with context: ExtensionContext) async {
        let command = context.inputItems.first?.title ?? ""
        do {
            switch command {
            case let c where c.hasPrefix("hold:"):
                let n = Int(c.dropFirst(5)) ?? 3
                let parts = try await withThrowingTaskGroup(of: String.self) { group in
                    for i in 1...max(n, 1) {
                        group.addTask { try await part("hold-\(i)", context) }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                context.completeRequest(returningItems: [ExtensionItem(text: parts.sorted().joined(separator: ","))])
            case "crash-in-call":
                Task.detached {
                    try? await Task.sleep(nanoseconds: 200_000_000)  // the call is in the app by now
                    abort()
                }
                _ = try await part("crash", context)
                context.completeRequest(returningItems: [])
            case "unlisted":
                do {
                    _ = try await context.callHost("secret.key", [ExtensionItem(title: "please")])
                    context.completeRequest(returningItems: [ExtensionItem(text: "the host answered")])
                } catch {
                    context.completeRequest(returningItems: [ExtensionItem(text: "\(error)")])
                }
            case let c where c.hasPrefix("over-cap:"):
                let n = Int(c.dropFirst(9)) ?? 17
                let failed = await withTaskGroup(of: Bool.self) { group in
                    for i in 1...max(n, 1) {
                        group.addTask { (try? await part("cap-\(i)", context)) == nil }
                    }
                    return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
                }
                context.completeRequest(returningItems: [ExtensionItem(text: "\(failed) failed")])
            case "file":
                let file = try FileAttachment(bytes: Array("sealed part".utf8))
                let answer = try await context.callHost("document.part", [ExtensionItem(title: "file", fileAttachments: [file])])
                let back = try answer.first?.fileAttachments.first?.readAll() ?? []
                context.completeRequest(returningItems: [ExtensionItem(text: String(decoding: back, as: UTF8.self))])
            case "end-with-call":
                Task { _ = try? await part("hold-end", context) }
                try await Task.sleep(nanoseconds: 100_000_000)  // the call is in the app by now
                context.completeRequest(returningItems: [ExtensionItem(text: "ended")])
            case "blocking":
                let document = context.inputItems.first?.text ?? ""
                let rendered = try await withCheckedThrowingContinuation { (c: CheckedContinuation<String, any Error>) in
                    DispatchQueue.global().async { c.resume(with: Result { try render(document) { try blockingPart($0, context) } }) }
                }
                context.completeRequest(returningItems: [ExtensionItem(text: rendered)])
            default:
                var rendered = ""
                for piece in pieces(of: context.inputItems.first.flatMap { $0.text ?? $0.title } ?? "") {
                    switch piece {
                    case .text(let text): rendered += text
                    case .part(let name): rendered += try await part(name, context)
                    }
                }
                context.completeRequest(returningItems: [ExtensionItem(text: rendered)])
            }
        } catch is CancellationError {
            // The host cancelled the request: the runtime ends it as cancelled when we return.
        } catch let error as ExtensionError {
            context.cancelRequest(withError: error)
        } catch {
            context.cancelRequest(withError: ExtensionError(domain: "com.example.renderer", code: 1, message: "\(error)"))
        }
    }
}

/// The part `name` of the document, from the app.
func part(_ name: String, _ context: ExtensionContext) async throws -> String {
    let answer = try await context.callHost("document.part", [ExtensionItem(title: name)])
    return answer.first?.text ?? ""
}

func blockingPart(_ name: String, _ context: ExtensionContext) throws -> String {
    let answer = try context.callHost("document.part", [ExtensionItem(title: name)])
    return answer.first?.text ?? ""
}

/// A document's text and the parts it refers to (`{{name}}`), in order.
enum Piece { case text(Substring), part(String) }

func pieces(of document: String) -> [Piece] {
    var out: [Piece] = []
    var rest = Substring(document)
    while let open = rest.firstRange(of: "{{"), let close = rest[open.upperBound...].firstRange(of: "}}") {
        out.append(.text(rest[..<open.lowerBound]))
        out.append(.part(String(rest[open.upperBound..<close.lowerBound])))
        rest = rest[close.upperBound...]
    }
    out.append(.text(rest))
    return out
}

/// `document` with each `{{name}}` replaced by `part(name)`.
func render(_ document: String, _ part: (String) throws -> String) rethrows -> String {
    try pieces(of: document).map { piece in
        switch piece {
        case .text(let text): String(text)
        case .part(let name): try part(name)
        }
    }.joined()
}
