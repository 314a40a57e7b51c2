package localmq.spark;

/**
 * Requested offsets that retention removed or damage lost ({@code failOnDataLoss} on), or an ending offset before a
 * starting one: the Python source's {@code OffsetRangeError}.
 */
public class OffsetRangeException extends IllegalStateException {
    private static final long serialVersionUID = 1L;

    OffsetRangeException(String message) {
        super(message);
    }
}
