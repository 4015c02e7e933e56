// AsyncEcho (com.example.async-echo): an async handler. The first item's title picks the behaviour:
//   "sleep:<ms>"  await Task.sleep, then echo; a host cancel cancels the Task and the request ends cancelled
//   "forget"      return without finishing (the runtime reports it, cancelled with an SDKExtension error)
//   anything else echo at once
import SDKExtension

@main
struct AsyncEcho: AsyncRequestHandler {
    func beginRequest(with context: ExtensionContext) async {
        let command = context.inputItems.first?.title ?? ""
        if command == "forget" { return }
        if command.hasPrefix("sleep:"), let ms = UInt64(command.dropFirst(6)) {
            do {
                try await Task.sleep(nanoseconds: ms * 1_000_000)
            } catch {
                // Cancelled by the host: the runtime finishes the request as cancelled when we return.
                return
            }
        }
        context.completeRequest(returningItems: context.inputItems)
    }
}
